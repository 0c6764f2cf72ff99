"""The speed stack benchmark (:mod:`.stack_bench`): eager -> graphs -> + compile -> + float8 -> + step cache, per
image, each accelerated layer compared bitwise with the same stack run eagerly."""

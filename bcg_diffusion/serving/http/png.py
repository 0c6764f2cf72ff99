"""Images on the wire: PNG + base64 for responses, and the hashes the load test compares."""

from __future__ import annotations

import base64
import hashlib
import io

from PIL import Image

__all__ = ["decode_b64_png", "encode_png_b64", "payload_hash", "pixel_hash"]

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def encode_png_b64(image: Image.Image) -> str:
    """The image as PNG (no metadata, fixed compression: the same pixels give the same bytes), base64 text."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", compress_level=6)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def decode_b64_png(text: str) -> Image.Image:
    """The image of a ``b64_json`` payload; ``ValueError`` when it is not a PNG."""
    data = base64.b64decode(text, validate=True)
    if not data.startswith(PNG_MAGIC):
        raise ValueError("payload is not a PNG (bad magic bytes)")
    image = Image.open(io.BytesIO(data))
    image.load()
    return image


def payload_hash(text: str) -> str:
    """SHA-256 of a ``b64_json`` payload (equal payloads: equal PNG bytes)."""
    return hashlib.sha256(text.encode("ascii")).hexdigest()


def pixel_hash(text: str) -> str:
    """SHA-256 of the decoded pixels (mode, size and raw bytes): equal whatever PNG encoder wrote them."""
    image = decode_b64_png(text)
    digest = hashlib.sha256(f"{image.mode}:{image.width}x{image.height}:".encode())
    digest.update(image.tobytes())
    return digest.hexdigest()

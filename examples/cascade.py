"""The cascaded-model workflow: image-caption pairs, then 256 latents, new pairs arriving,
latents for the new ones only, then 512 latents, then training from a pinned version.

The "VAE" here is a stand-in (a deterministic function of the image bytes), computed in
batches as a GPU model would be. Needs txstore[torch] for the last step.

Run: python examples/cascade.py [path]   (default ./cascade-store, recreated each run)
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np

import txstore


def pairs(first: int, n: int) -> Iterator[dict[str, Any]]:
    for i in range(first, first + n):
        yield {"id": i, "caption": f"photo {i}", "image": bytes([i % 256]) * 3072}


def vae(size: int) -> Any:
    """A batch function: images in, one (4, size/8, size/8) latent per image out."""

    def encode(batch: dict[str, list[Any]]) -> dict[str, Any]:
        pixels = np.frombuffer(b"".join(batch["image"]), dtype=np.uint8).reshape(-1, 3072)
        means = pixels.mean(axis=1, dtype=np.float32)
        side = size // 8
        latents = np.broadcast_to(means[:, None, None, None], (len(means), 4, side, side))
        return {f"latent_{size}": latents}

    return encode


def main(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)
    store = txstore.create(path, chunk_bytes="2MB")
    store.append(pairs(0, 8_000), message="pairs")
    store.add_fields(vae(256), ["latent_256"], inputs=["image"], batch_size=256)
    store.append(pairs(8_000, 500), message="new pairs")
    schema = store.snapshot().schema()["latent_256"]
    print(f"latent_256: {schema.count:,} of {schema.total:,} samples ({schema.missing:,} missing)")
    try:
        txstore.StreamingDataset(store.snapshot(), fields=["id", "latent_256"])
    except txstore.FieldMissingError as e:
        print(f"a dataset refuses to open: {e.count:,} samples lack {e.field!r}")
    commit = store.add_fields(
        vae(256), ["latent_256"], inputs=["image"], batch_size=256, missing_only=True
    )
    print(f"v{commit.version}: latents for the {schema.missing:,} new pairs only")
    commit = store.add_fields(vae(512), ["latent_512"], inputs=["image"], batch_size=256)
    store.tag("train-512", commit.version)
    pinned = store.snapshot("train-512")
    for field in pinned.schema():
        print(f"  {field.name:<11} {field.type:<28} {field.count:>6,} samples")
    ds = txstore.StreamingDataset(pinned, fields=["id", "latent_512"], shuffle=True, seed=42)
    loader = txstore.StreamingDataLoader(ds, batch_size=128, num_workers=2)
    seen = sum(len(batch["id"]) for batch in loader)
    print(f"one epoch over version {pinned.version}: {seen:,} samples")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "cascade-store")

"""The plain driver the seed's recipes describe, as the baseline of the driver-cost benchmark:
for every page decode it, convert it to RGB, downscale it with LANCZOS above the pixel bound,
encode it as JPEG quality 95, base64 it into a JSON body, and post it from a thread per request;
then write the dataset (images and text) to parquet, as the recipes push theirs to the Hub.

    python benchmarks/reference_driver.py IMAGE_FOLDER SERVER_URL MODEL OUTPUT_PARQUET
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import math
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from PIL import Image

MAX_PIXELS = 2880 * 2880
PROMPT = "Extract all readable content from the image."


def encode_page(path: Path) -> str:
    img = Image.open(path)
    img = img.convert("RGB")
    if img.width * img.height > MAX_PIXELS:
        scale = math.sqrt(MAX_PIXELS / (img.width * img.height))
        img = img.resize((int(img.width * scale), int(img.height * scale)), Image.LANCZOS)
    out = io.BytesIO()
    img.save(out, format="JPEG", quality=95)
    return base64.b64encode(out.getvalue()).decode()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("folder")
    parser.add_argument("server")
    parser.add_argument("model")
    parser.add_argument("output")
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()
    paths = sorted(p for p in Path(args.folder).iterdir() if p.suffix in (".jpg", ".png"))
    client = httpx.Client(timeout=600, limits=httpx.Limits(max_connections=args.concurrency))

    def one(path: Path) -> str | None:
        body = {"model": args.model, "temperature": 0.0, "max_tokens": 64, "messages": [{
            "role": "user", "content": [
                {"type": "image_url", "image_url": {"url": f"data:image/jpeg;base64,{encode_page(path)}"}},
                {"type": "text", "text": PROMPT}]}]}
        payload = json.dumps(body)
        for attempt in range(3):  # a dropped keep-alive connection is retried, as any client would
            try:
                response = client.post(f"{args.server}/v1/chat/completions", content=payload,
                                       headers={"Content-Type": "application/json"})
                break
            except httpx.TransportError:
                if attempt == 2:
                    raise
        if response.status_code != 200:
            return None
        return response.json()["choices"][0]["message"]["content"]

    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=args.concurrency) as pool:
        texts = list(pool.map(one, paths))
    import datasets

    ds = datasets.Dataset.from_dict({"image": [str(p) for p in paths], "markdown": texts})
    ds.cast_column("image", datasets.Image()).to_parquet(args.output)
    ok = sum(t is not None for t in texts)
    print(json.dumps({"pages": len(paths), "ok": ok, "elapsed_s": time.monotonic() - started}))
    return 0 if ok == len(paths) else 1


if __name__ == "__main__":
    sys.exit(main())

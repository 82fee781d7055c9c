"""Encoder time and fidelity per runtime on one fixed batch: where the CPU time of a member goes.

Usage::

    python benchmarks/encoder_runtimes.py [--model DIR] [--threads 1] [--batch 32] [--length 128]

Times one ``[batch, length]`` batch of random token ids (no text; 5 rows padded after position
100) through the model's encoder with every runtime available here, and compares each output with
PyTorch fp32 (largest absolute difference and smallest per-token cosine similarity over the real
positions):

* ``torch`` fp32 and ``torch-bf16`` (``torch.autocast`` bfloat16; only meaningful on hardware with
  native bfloat16, which the script reports);
* ONNX Runtime fp32 and int8 (the graphs ``dphub.runtime`` builds and caches);
* OpenVINO fp32 and bf16 on the fp32 ONNX graph, when the ``openvino`` package is importable (it is
  not a dphub dependency: ``pip install openvino`` to include these rows).

``--model`` defaults to an untrained tagger on the embedded all-MiniLM-L6-v2 (the encoder costs
what a trained one costs).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch


def _batch(batch: int, length: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    ids = rng.integers(1000, 20000, size=(batch, length)).astype(np.int64)
    ids[:, 0] = 101
    mask = np.ones_like(ids)
    mask[5:, 100:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def _time(fn: Callable[[], np.ndarray], repeats: int) -> tuple[float, np.ndarray]:
    fn()  # warm-up (allocations, kernel choice)
    t0 = time.perf_counter()
    for _ in range(repeats):
        out = fn()
    return (time.perf_counter() - t0) / repeats, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, help="tagger directory (default: untrained MiniLM)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--length", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=6)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from dphub import runtime
    from dphub.tagger import Tagger, TaggerModel

    with tempfile.TemporaryDirectory(prefix="dphub-enc-") as tmp:
        if args.model is None:
            TaggerModel.from_base(None).save(Path(tmp) / "m")
            args.model = Path(tmp) / "m"
        tagger = Tagger.load(args.model)
        feed = _batch(args.batch, args.length)
        real = feed["attention_mask"].astype(bool)
        batch_t = {k: torch.from_numpy(v) for k, v in feed.items()}
        enc = tagger.model.eval()

        def torch_run(bf16: bool) -> np.ndarray:
            with torch.inference_mode():
                if bf16:
                    with runtime.bf16_autocast("cpu"):
                        return enc.encode(batch_t).float().numpy()
                return enc.encode(batch_t).numpy()

        rows: list[tuple[str, float, np.ndarray]] = []
        dt, ref = _time(lambda: torch_run(False), args.repeats)
        rows.append(("torch fp32", dt, ref))
        rows.append(("torch-bf16", *_time(lambda: torch_run(True), args.repeats)))
        sessions = {}
        for rt in ("onnx", "onnx-int8"):
            sess, status = runtime.load_encoder(rt, enc.encoder, tagger.encoder_digest,
                                                threads=args.threads)
            sessions[rt] = status.path
            rows.append((f"onnxruntime {rt.removeprefix('onnx').lstrip('-') or 'fp32'}",
                         *_time(lambda s=sess: s(batch_t).numpy(), args.repeats)))
        try:
            import openvino as ov
        except ImportError:
            ov = None
        if ov is not None:
            core = ov.Core()
            model = core.read_model(str(sessions["onnx"]))
            for prec in ("f32", "bf16"):
                cfg = {"INFERENCE_NUM_THREADS": args.threads, "INFERENCE_PRECISION_HINT": prec}
                compiled = core.compile_model(model, "CPU", cfg)
                req = compiled.create_infer_request()
                rows.append((f"openvino {prec}", *_time(
                    lambda r=req, c=compiled: r.infer(feed)[c.output(0)].copy(), args.repeats)))
    print(f"batch {args.batch} x {args.length} pieces, {args.threads} thread(s); native bf16 on "
          f"this CPU: {runtime.native_bf16('cpu')}; openvino: "
          f"{'yes' if ov is not None else 'not installed'}")
    print(f"| {'runtime':<18} | {'ms / batch':>10} | {'vs torch fp32':>13} | {'max abs diff':>12} "
          f"| {'min cosine':>10} |")
    print(f"|{'-' * 20}|{'-' * 12}|{'-' * 15}|{'-' * 14}|{'-' * 12}|")
    for name, dt, out in rows:
        cos = (out * ref).sum(-1) / (np.linalg.norm(out, axis=-1) * np.linalg.norm(ref, axis=-1))
        print(f"| {name:<18} | {dt * 1000:>10.0f} | {rows[0][1] / dt:>12.2f}x "
              f"| {float(np.abs(out - ref)[real].max()):>12.2e} | {float(cos[real].min()):>10.5f} |")


if __name__ == "__main__":
    main()

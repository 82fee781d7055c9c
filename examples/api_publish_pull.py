"""Stage 2 with the Python API: publish a DP model to a hub, search it, pull it, tag with it.

Usage::

    python examples/api_publish_pull.py [--model DIR] [--hub DIR] [--base-model PATH]

These are the calls behind `dphub publish`, `dphub search` and `dphub pull`. Without ``--model``
a tiny DP model is trained first (``api_train.py``). The hub is a local directory (one git
repository per model; a ``http(s)://`` Hugging Face endpoint works the same way), and the pulled
model goes into a registry in a temporary directory, so the example touches nothing of yours.

* ``publish`` runs the gate first: the card must validate (ε recomputed from q, σ, steps, δ), the
  files must be safetensors plus the public base model's tokenizer, no local paths or user names.
* ``pull`` downloads into a staging directory, checks hashes, card and the puller's policy
  (``max_epsilon``, ``require_unit``), and only then registers the model.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=None, help="Model directory to publish.")
    p.add_argument("--hub", default=None, help="Hub directory or URL (default: a temp dir).")
    p.add_argument("--base-model", default=None, help="Base encoder dir for the tiny model.")
    args = p.parse_args(argv)

    work = Path(tempfile.mkdtemp(prefix="dphub-api-hub-"))
    model = args.model
    if model is None:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import api_train

        model = work / "model"
        train_args = ["--out", str(model)]
        if args.base_model:
            train_args += ["--base-model", args.base_model]
        api_train.main(train_args)
    hub = args.hub or str(work / "hub")

    from dphub.hub import ops
    from dphub.registry import Registry

    # publish: gate + one commit (a new revision) per publish
    sha, summary = ops.publish(model, "example/deid-nursing", hub=hub, tag="v1")
    print(f"published example/deid-nursing@{sha[:12]} (ε = {summary.epsilon:.2f}, "
          f"unit = {summary.unit})")

    # search: the latest revision of every model whose card matches the filters
    for row in ops.search(hub=hub, unit="patient", max_epsilon=10):
        print(f"found {row.repo}@{row.revision[:12]}: ε = {row.summary.epsilon:.2f}, "
              f"{row.summary.patients} patients")

    # pull: verify, then register in the owner's registry (here a temp dir, not ~/.local/share)
    registry = Registry(work / "home")
    entry = ops.pull("example/deid-nursing@v1", hub=hub, max_epsilon=10,
                     require_unit="patient", registry=registry)
    print(f"pulled {entry.name}@{entry.revision[:12]} -> {entry.path}")

    # use it: a Tagger answers in character spans of the note text
    from dphub import synth
    from dphub.tagger import Tagger

    tagger = Tagger.load(registry.get("example/deid-nursing").path)
    notes = synth.generate(3, kind="nursing", seed=42)
    for note, spans in zip(notes, tagger.tag(notes), strict=True):
        # offsets and labels only: tools that log never print the note text
        print(f"{note.id}: {len(spans)} PHI spans, e.g. "
              + ", ".join(f"{s.label}@{s.start}-{s.end}" for s in spans[:3]))
    return 0


if __name__ == "__main__":
    sys.exit(main())

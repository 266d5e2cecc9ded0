"""The conformance catalogue (issue 35 item 5): every Hugging Face Flax architecture of
``transformers`` 4.x with a trainable causal-LM, seq2seq, masked-LM or image-classification
head (``_hf.py``), every ``keras.applications`` family (``_keras.py``), and Equinox's and
Flax NNX's own example models (``_examples.py``), each buildable at a tiny size (the tests:
``tests/test_conformance.py``) and at its published one (``experiments/catalogue.py``).

    import catalogue  # with experiments/models on sys.path
    wl = catalogue.ENTRIES["hf_gpt2_clm"].build("tiny")

As a model file: ``autolayout plan experiments/models/catalogue/__init__.py --set
entry=keras_resnet --set size=published --hw h100-64``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

os.environ.setdefault("KERAS_BACKEND", "jax")
HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:  # the entry modules import each other flat, as model files do
    sys.path.insert(0, HERE)

import _examples  # noqa: E402
import _hf  # noqa: E402
import _keras  # noqa: E402

import autolayout as al  # noqa: E402


@dataclass(frozen=True)
class Entry:
    """One model of the catalogue. ``build(size)``: its workload, ``size`` "tiny" or
    "published"; ``published``: what the published size is (a checkpoint, a constructor)."""

    name: str
    family: str  # causal-lm, masked-lm, seq2seq, image-classification, ...
    library: str  # transformers, keras, equinox, flax-nnx
    build: Callable[..., al.Workload]
    published: str
    head: str = ""  # the library's class or constructor
    # what MFU it can reach is judged against (experiments/catalogue.py's "silly"):
    # transformer, convnet, depthwise-convnet (memory-bound separable convolutions) or
    # mnist-example (a tutorial's model, whatever its batch)
    kind: str = "transformer"

    def __repr__(self) -> str:
        return f"Entry({self.name}: {self.library} {self.family}, {self.published})"


def _entries() -> dict[str, Entry]:
    out = {}
    for name, (family, model_type, cls, published) in _hf.entries()[0].items():
        kind = "convnet" if model_type in _hf.BATCH_STATS else "transformer"
        out[name] = Entry(name, family, "transformers",
                          partial(_hf.build, name, cls, family, model_type), published, cls,
                          kind)  # fmt: skip
    for family, published in _keras.PUBLISHED.items():
        name = f"keras_{family}"
        kind = "depthwise-convnet" if family in _keras.DEPTHWISE else "convnet"
        out[name] = Entry(name, "image-classification", "keras", partial(_keras.build, family),
                          published, f"keras.applications.{family}", kind)  # fmt: skip
    for name, published in _examples.PUBLISHED.items():
        library = "equinox" if name.startswith("eqx_") else "flax-nnx"
        family = _examples.FAMILY.get(name, "image-classification")
        kind = "mnist-example" if name in _examples.SIZES else "transformer"
        out[name] = Entry(name, family, library, partial(_examples.build, name), published,
                          kind=kind)  # fmt: skip
    return out


ENTRIES: dict[str, Entry] = _entries()
LEFT_OUT: dict[str, str] = _hf.entries()[1]  # transformers' head classes left out, and why


def workload(entry: str = "hf_gpt2_clm", size: str = "tiny", dtype: str = "") -> al.Workload:
    """The catalogue's ``entry`` at ``size`` ("tiny" or "published"), as a model file."""
    if entry not in ENTRIES:
        raise ValueError(f"unknown entry {entry!r}; known: {', '.join(ENTRIES)}")
    return ENTRIES[entry].build(size, dtype)

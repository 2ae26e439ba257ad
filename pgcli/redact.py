"""Keep secrets out of everything pgcli stores or prints (docs/tracking.md, "Credentials and secrets").

Two kinds of secret reach a run: credentials inside a URI (``tracking.uri=http://user:pass@host:5000``, which MLflow
sends as HTTP basic auth) and values whose key names a secret (``+env.kwargs.api_token=...``). Both are replaced by
``***`` in MLflow params and tags (:mod:`pgcli.tracking.backend` calls :func:`redact_mapping` on every write), in the
``.hydra/*.yaml`` files of the run directory before they are logged as artifacts (:func:`redact_hydra_dir`), and in
console output (:func:`redact_text`). Where a tracking URI is named on its own, :func:`redact_uri` masks it: without
its credentials in files (``run.json``, the spool) and warnings, or with the user kept for the read-only commands. The
connection itself still uses the URI as given.

This module must stay light (no torch, SB3 or MLflow imports): the CLI uses it before anything runs.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

MASK = "***"
SECRET_WORDS = r"token(?!s|iz|_id)|passw(?:or)?d|secret|api[_-]?key|credential"
"""What a secret's key contains: ``api_token``, ``hf_token``, ``password``, ... (not a count or an id of tokens:
``max_new_tokens``, ``tokenizer``, ``pad_token_id`` are settings, logged as typed)."""
SECRET_KEY = re.compile(SECRET_WORDS, re.IGNORECASE)
"""A key (or the last part of a dotted key) whose value is masked whatever it is."""
URI_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/\s'\"]+)@")
"""``scheme://user:pass@`` in any text; the user name goes too (it can be an access token)."""
SECRET_ASSIGNMENT = re.compile(rf"(?P<key>[\w.]*(?:{SECRET_WORDS})\w*)=(?P<value>[^\s,]+)", re.IGNORECASE)
"""``api_token=abc`` inside a command line or Hydra's ``override_dirname``."""


def is_secret_key(key: str) -> bool:
    """Whether a param, tag or config key names a secret (``api_token``, ``env.kwargs.password``, ...)."""
    return bool(SECRET_KEY.search(key.rsplit(".", 1)[-1]))


def redact_text(text: str) -> str:
    """``text`` with URI credentials (``http://u:p@host`` -> ``http://***@host``) and the values of secret-named
    ``key=value`` assignments (``+env.kwargs.api_token=***``) replaced."""
    text = URI_USERINFO.sub(lambda m: f"{m['scheme']}{MASK}@", text)
    return SECRET_ASSIGNMENT.sub(lambda m: f"{m['key']}={MASK}", text)


def redact_uri(uri: str, *, keep_user: bool = False) -> str:
    """``http://user:pass@host:5000`` -> ``http://host:5000`` (a file never holds a password); with ``keep_user``,
    ``http://user:***@host:5000`` (the read-only commands' messages say whose credentials, not which)."""
    parts = urlsplit(uri)
    if parts.password is None and (keep_user or parts.username is None):
        return uri
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    netloc = f"{parts.username}:{MASK}@{host}{port}" if keep_user else f"{host}{port}"
    return urlunsplit(parts._replace(netloc=netloc))


def redact_value(key: str, value: Any) -> Any:
    """``value`` for storing under ``key``: masked when the key names a secret, URI credentials stripped."""
    if is_secret_key(key):
        return MASK
    return redact_text(value) if isinstance(value, str) else value


def redact_mapping(items: Mapping[str, Any]) -> dict[str, Any]:
    """Params or tags ready to store: :func:`redact_value` applied to each."""
    return {key: redact_value(key, value) for key, value in items.items()}


def redact_tree(node: Any, key: str = "") -> Any:
    """A nested structure of dicts, lists and scalars (a loaded YAML file) with every secret masked."""
    if isinstance(node, Mapping):
        return {k: redact_tree(v, str(k)) for k, v in node.items()}
    if isinstance(node, list):
        return [redact_tree(v, key) for v in node]
    if key and is_secret_key(key) and node is not None:
        return MASK
    return redact_text(node) if isinstance(node, str) else node


def redact_yaml_file(path: Path) -> bool:
    """Rewrite a YAML file with secrets masked, if it has any; returns whether it changed."""
    from omegaconf import OmegaConf

    loaded = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    clean = redact_tree(loaded)
    if clean == loaded:
        return False
    path.write_text(OmegaConf.to_yaml(OmegaConf.create(clean)))
    return True


def redact_hydra_dir(hydra_dir: Path) -> list[Path]:
    """Rewrite the ``*.yaml`` files Hydra saved in a run's ``.hydra/`` with secrets masked; returns those changed.

    Hydra writes ``config.yaml``, ``hydra.yaml`` and ``overrides.yaml`` before the job starts, and they are logged as
    the run's ``hydra`` artifact at the end, so masking them here covers both the run directory and the store.
    """
    paths = sorted(hydra_dir.glob("*.yaml")) if hydra_dir.is_dir() else []
    return [path for path in paths if redact_yaml_file(path)]

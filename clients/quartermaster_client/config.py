"""Contexts: named (server, token, namespace) triples in a kubeconfig-like
file, ``$QMCTL_CONFIG`` or ``~/.config/qmctl/config``.

```yaml
apiVersion: qmctl/v1
kind: Config
current-context: local
contexts:
- name: local
  context: {server: http://127.0.0.1:8080, token: ..., namespace: team-a}
```

Explicit arguments win over the environment (``QMCTL_SERVER``,
``QMCTL_TOKEN``, ``QMCTL_NAMESPACE``), which wins over the context.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from quartermaster_client.errors import ConfigError

ENV_CONFIG = "QMCTL_CONFIG"


def default_path() -> Path:
    explicit = os.environ.get(ENV_CONFIG)
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "qmctl" / "config"


@dataclass
class Context:
    name: str
    server: str | None = None
    token: str | None = None
    namespace: str | None = None

    def to_dict(self) -> dict[str, Any]:
        body = {
            k: v
            for k, v in (
                ("server", self.server),
                ("token", self.token),
                ("namespace", self.namespace),
            )
            if v
        }
        return {"name": self.name, "context": body}


@dataclass
class ConfigFile:
    path: Path
    contexts: dict[str, Context] = field(default_factory=dict)
    current_context: str | None = None

    @classmethod
    def load(cls, path: Path | str | None = None) -> ConfigFile:
        where = Path(path).expanduser() if path else default_path()
        if not where.exists():
            return cls(where)
        try:
            raw = yaml.safe_load(where.read_text()) or {}
        except yaml.YAMLError as error:
            raise ConfigError(f"{where}: not valid YAML: {error}") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{where}: expected a mapping at the top level")
        contexts: dict[str, Context] = {}
        for entry in raw.get("contexts") or []:
            if not isinstance(entry, dict) or not entry.get("name"):
                raise ConfigError(f"{where}: every context needs a name")
            body = entry.get("context") or {}
            contexts[str(entry["name"])] = Context(
                str(entry["name"]), body.get("server"), body.get("token"), body.get("namespace")
            )
        current = raw.get("current-context")
        return cls(where, contexts, str(current) if current else None)

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        document = {
            "apiVersion": "qmctl/v1",
            "kind": "Config",
            "current-context": self.current_context or "",
            "contexts": [c.to_dict() for c in self.contexts.values()],
        }
        text = yaml.safe_dump(document, sort_keys=False)
        # The file holds bearer tokens: readable by its owner only.
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(text)
        self.path.chmod(0o600)

    def set_context(
        self,
        name: str,
        server: str | None = None,
        token: str | None = None,
        namespace: str | None = None,
    ) -> Context:
        """Create the context or change the fields given (others are kept)."""
        context = self.contexts.get(name) or Context(name)
        context.server = server or context.server
        context.token = token or context.token
        context.namespace = namespace or context.namespace
        self.contexts[name] = context
        if self.current_context is None:
            self.current_context = name
        return context

    def use(self, name: str) -> Context:
        if name not in self.contexts:
            raise ConfigError(
                f"no context {name!r} in {self.path}; known: {', '.join(self.contexts) or 'none'}"
            )
        self.current_context = name
        return self.contexts[name]

    def delete(self, name: str) -> None:
        if self.contexts.pop(name, None) is None:
            raise ConfigError(f"no context {name!r} in {self.path}")
        if self.current_context == name:
            self.current_context = None

    def context(self, name: str | None = None) -> Context | None:
        wanted = name or self.current_context
        if wanted is None:
            return None
        if wanted not in self.contexts:
            raise ConfigError(f"no context {wanted!r} in {self.path}")
        return self.contexts[wanted]


@dataclass(frozen=True)
class Connection:
    server: str
    token: str | None
    namespace: str | None
    context: str | None


def resolve(
    server: str | None = None,
    token: str | None = None,
    namespace: str | None = None,
    context: str | None = None,
    config_path: Path | str | None = None,
) -> Connection:
    """Where to connect and as whom, from arguments, environment and context."""
    server = server or os.environ.get("QMCTL_SERVER")
    token = token or os.environ.get("QMCTL_TOKEN")
    namespace = namespace or os.environ.get("QMCTL_NAMESPACE")
    chosen: Context | None = None
    if context or not (server and token):
        chosen = ConfigFile.load(config_path).context(context)
    if chosen is not None:
        server = server or chosen.server
        token = token or chosen.token
        namespace = namespace or chosen.namespace
    if not server:
        raise ConfigError(
            "no server: pass --server, set QMCTL_SERVER, or "
            "`qmctl config set-context NAME --server URL --token TOKEN --use`"
        )
    return Connection(server.rstrip("/"), token, namespace, chosen.name if chosen else None)


__all__ = ["ConfigFile", "Connection", "Context", "default_path", "resolve"]

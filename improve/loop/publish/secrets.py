"""Keeping secrets off the wire and out of messages: the token lookup and the scrubber.

The token comes from `GITHUB_TOKEN`, else `GH_TOKEN`. The scrubber knows the token, the base64 forms
git and HTTP basic auth wrap it in, and the value of every secret-looking environment variable
(`*TOKEN*`, `*SECRET*`, `*PASSWORD*`, `*API_KEY*`, ...). Every message, exception and result of the
package goes through it, and so do the PR title, body and commit message before they leave the
machine; a file that contains such a value is refused rather than scrubbed (`Scrubber.find`), since a
silently altered policy file would be worse than no pull request.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping

__all__ = ["Scrubber", "find_token"]

_REDACTED = "***"
_SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSW|API_?KEY|PRIVATE_?KEY|CREDENTIAL", re.IGNORECASE)
# shorter values are too likely to occur by chance ("true", a port number) to be worth replacing
_MIN_SECRET_LEN = 8


class Scrubber:
    """Replaces every secret value (and the encodings git and HTTP use for it) with `***`."""

    def __init__(self, env: Mapping[str, str], token: str | None) -> None:
        values: set[str] = set()
        self.names: dict[str, str] = {}
        for name, value in env.items():
            if value and len(value) >= _MIN_SECRET_LEN and _SECRET_NAME.search(name):
                values.add(value)
                self.names.setdefault(value, name)
        if token:
            values.add(token)
            for user in ("x-access-token", "oauth2", "git"):
                values.add(base64.b64encode(f"{user}:{token}".encode()).decode())
        # longest first, so a secret that contains another is replaced whole
        self.values = sorted(values, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        for value in self.values:
            text = text.replace(value, _REDACTED)
        return text

    def find(self, text: str) -> str | None:
        """The environment variable name of a secret found in `text` (or "the token")."""
        for value in self.values:
            if value in text:
                return self.names.get(value, "the token")
        return None


def find_token(env: Mapping[str, str]) -> str | None:
    """The GitHub token: `GITHUB_TOKEN`, else `GH_TOKEN`; None when neither is set (or blank)."""
    for name in ("GITHUB_TOKEN", "GH_TOKEN"):
        value = env.get(name, "").strip()
        if value:
            return value
    return None

"""Which responses a policy charges (`charge_on`) or that clear its count (`reset_on`).

Written as a comma-separated list of status codes (`401`), classes of them (`4xx`) and
one word for a Django signal sent during the request: `login_failed` for `charge_on`
(`user_login_failed`: Django's `LoginView` answers a failed login with a 200),
`login` for `reset_on` (`user_logged_in`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["CHARGE_WORD", "RESET_WORD", "ResponseRule", "parse_responses"]

#: The signal words each field takes.
CHARGE_WORD = "login_failed"
RESET_WORD = "login"

_CLASS = re.compile(r"[1-5]xx\Z")
_CODE = re.compile(r"[1-5][0-9][0-9]\Z")


@dataclass(frozen=True, slots=True)
class ResponseRule:
    """A parsed `charge_on` or `reset_on`."""

    statuses: frozenset[int] = frozenset()
    classes: frozenset[int] = frozenset()  # 4 for "4xx"
    #: The request during which the field's signal fired matches.
    signal: bool = False

    def matches(self, status: object, signalled: bool) -> bool:
        """Whether a response of `status` (during which the signal fired, `signalled`)
        is one this rule names."""
        if signalled and self.signal:
            return True
        if not isinstance(status, int):
            return False
        return status in self.statuses or status // 100 in self.classes

    def shared_with(self, other: ResponseRule) -> str:
        """The statuses both rules name, as written ("4xx", "404, 429"); "" when none.
        (Their signals never meet: one is a failed login, the other a login.)"""
        codes = [c for c in range(100, 600) if self.matches(c, False) and other.matches(c, False)]
        whole = sorted({c // 100 for c in codes if all(
            self.matches(x, False) and other.matches(x, False)
            for x in range(c // 100 * 100, c // 100 * 100 + 100))})
        parts = [f"{k}xx" for k in whole] + [str(c) for c in codes if c // 100 not in whole]
        return ", ".join(parts)


def parse_responses(text: str, word: str) -> ResponseRule | None:
    """`text` as a rule whose signal word is `word`; None when it is empty; ValueError
    naming the first entry that is none of a status, a class of statuses or `word`."""
    statuses: set[int] = set()
    classes: set[int] = set()
    signal = False
    for raw in (text or "").split(","):
        entry = raw.strip().lower()
        if not entry:
            continue
        if entry == word:
            signal = True
        elif _CLASS.match(entry):
            classes.add(int(entry[0]))
        elif _CODE.match(entry):
            statuses.add(int(entry))
        else:
            raise ValueError(
                f"{raw.strip()[:40]!r} is not a status code (401), a class of them (4xx) "
                f"or {word!r}; write e.g. \"401,403\", \"4xx\" or \"{word}\"")
    if not (statuses or classes or signal):
        return None
    return ResponseRule(frozenset(statuses), frozenset(classes), signal)

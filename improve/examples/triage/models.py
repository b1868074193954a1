"""The triage desk's stand-in models, and the desk's rules as its people apply them.

`careful` triages as the desk does (`desk_answer`, the rules in order, safest first). `naive` is a
plausible first attempt with systematic mistakes a policy can fix by rules over the facts: it routes on
the first keyword it reads, ignores the lock flag, the customer's plan and the open ticket, and closes
whatever the mail filter scores as spam (escalating when that is refused). `sloppy` breaks the rules the
guards must catch: it closes locked accounts' tickets, merges into tickets that do not exist, and
invents queues and events. Each is a plain function of the decision request and a seeded generator.
"""

from __future__ import annotations

import random
import re
from typing import Any

from improve.runtime import DecisionRequest, first_option, option

SPAM_SCORE = 5.0
"""The mail filter's score from which the desk treats a ticket as spam (the filter's own default)."""
PAYING = ("pro", "enterprise")
FOLLOW_UP_HOURS = 48
"""The desk answers within two days; a follow-up on a ticket open this long is a missed promise."""

# The desk's words, matched anywhere in the subject or body, in any case.
SECURITY = re.compile(
    r"breach|phish|hacked|hacker|compromised|unauthori[sz]ed|suspicious (?:log|sign)", re.IGNORECASE
)
BILLING = re.compile(
    r"invoice|billing|\bbilled\b|\bcharged?\b|\bcharges\b|refund|payment|receipt|\bvat\b|credit card|"
    r"bank transfer|pricing|\bpaid\b",
    re.IGNORECASE,
)
ACCOUNTS = re.compile(
    r"password|\blog ?in\b|\bsign[ -]?in\b|locked|two-factor|\b2fa\b|\bseats?\b|\bsso\b|"
    r"delete (?:my|our) account|email address|\binvite\b|\badmin\b",
    re.IGNORECASE,
)


def _text(facts: dict[str, Any]) -> str:
    ticket = facts["ticket"]
    return f"{ticket['subject']}\n{ticket['body']}"


def desk_answer(facts: dict[str, Any]) -> dict[str, Any]:
    """What the desk's people answer, by its rules in order (the first that applies wins):

    1. a security report on a locked account is escalated to the shift lead (a takeover in progress);
    2. any other ticket on a locked account goes to accounts, who unlock it first (never closed);
    3. a security report goes to security, even when it looks like spam or repeats an open ticket;
    4. an automatic reply (out of office, a bounce) is closed;
    5. a follow-up on the sender's open ticket is closed as its duplicate (merged, so nothing is lost),
       unless that ticket has been open 48 hours or more: the customer is chasing a missed promise, so
       the shift lead takes it;
    6. spam is closed, but never a paying customer's (pro, enterprise): theirs is routed by what it says;
    7. a billing question goes to billing, except an enterprise customer's, which goes to accounts
       (their account manager handles contracts and invoices);
    8. account access, seats and settings go to accounts; everything else to technical.
    """
    text = _text(facts)
    customer, ticket = facts["customer"], facts["ticket"]
    security = bool(SECURITY.search(text))
    if customer["locked"]:
        return {"type": "ESCALATE"} if security else {"type": "ROUTE", "queue": "accounts"}
    if security:
        return {"type": "ROUTE", "queue": "security"}
    if ticket["autoReply"]:
        return {"type": "CLOSE", "reason": "auto-reply"}
    if facts["openTicket"]["found"]:
        if int(facts["openTicket"]["hoursAgo"]) >= FOLLOW_UP_HOURS:
            return {"type": "ESCALATE"}
        return {"type": "CLOSE", "reason": "duplicate"}
    if float(ticket["spamScore"]) >= SPAM_SCORE and customer["plan"] not in PAYING:
        return {"type": "CLOSE", "reason": "spam"}
    if BILLING.search(text):
        return {"type": "ROUTE", "queue": "accounts" if customer["plan"] == "enterprise" else "billing"}
    if ACCOUNTS.search(text):
        return {"type": "ROUTE", "queue": "accounts"}
    return {"type": "ROUTE", "queue": "technical"}


def careful(request: DecisionRequest, rng: random.Random) -> dict[str, Any] | None:
    """Triages as the desk's people do."""
    answer = desk_answer(request.facts)
    payload = {k: v for k, v in answer.items() if k != "type"}
    return option(request, answer["type"], **payload) or option(request, "ESCALATE") or first_option(request)


# The keywords naive knows, per queue; it takes the queue of whichever it reads first.
NAIVE_WORDS = {
    "security": re.compile(r"\b(?:breach|phishing|hacked|compromised|unauthorized|suspicious)\b", re.I),
    "billing": re.compile(r"\b(?:invoices?|billing|charged|refund|payment|receipt|vat)\b", re.I),
    "accounts": re.compile(r"\b(?:password|login|log in|sign in|seats?|2fa|two-factor)\b", re.I),
    "technical": re.compile(
        r"\b(?:error|crash(?:es|ed)?|bug|broken|api|sync|slow|export|import|timeout)\b", re.I
    ),
}


def first_keyword_queue(text: str) -> str:
    """The queue of the earliest keyword in `text`; technical when there is none."""
    hits = [(m.start(), queue) for queue, words in NAIVE_WORDS.items() if (m := words.search(text))]
    return min(hits)[1] if hits else "technical"


def naive(request: DecisionRequest, rng: random.Random) -> dict[str, Any] | None:
    """A plausible model with systematic mistakes (see the module docstring)."""
    if request.attempts:
        return {"type": "ESCALATE"}
    ticket = request.facts["ticket"]
    if ticket["autoReply"]:
        return {"type": "CLOSE", "reason": "auto-reply"}
    if float(ticket["spamScore"]) >= SPAM_SCORE:
        return {"type": "CLOSE", "reason": "spam"}
    return {"type": "ROUTE", "queue": first_keyword_queue(_text(request.facts))}


def sloppy(request: DecisionRequest, rng: random.Random) -> dict[str, Any] | None:
    """Breaks rules the guards must catch: closes regardless, merges into nothing, invents answers."""
    roll = rng.random()
    if request.attempts and roll < 0.5:
        return rng.choice(request.options) if request.options else None
    if roll < 0.3:
        return {"type": "CLOSE", "reason": "spam"}
    if roll < 0.5:
        return {"type": "CLOSE", "reason": "duplicate"}
    if roll < 0.6:
        return {"type": "ROUTE", "queue": "sales"}
    if roll < 0.7:
        return {"type": "ASSIGN", "queue": "billing"}
    return careful(request, rng)

"""The triage desk's world: the senders' accounts, the open tickets, and what the tools do to the inbox.

World fixture (a scenario's `world`):

    accounts:    {ana@northwind.io: {id: A-1001, plan: pro, locked: false, seats: 12}}
    openTickets: [{ticketId: T-2951, from: ana@northwind.io, subject: "Export cuts off", hoursAgo: 20}]

A sender missing from `accounts` has no account (a visitor). An open ticket matches a new one from the
same sender whose subject is the same once reply and forward prefixes (`Re:`, `Fwd:`, ...), case and
spacing are set aside.

Effects recorded: `routed` (ticketId, queue), `escalation` (ticketId, reason), `closure` (ticketId,
from, reason, and `mergedInto` for a duplicate). A closure names its sender because the audit needs it:
the desk's hard rules are about whose ticket was closed.

`world_from_thread` rebuilds this fixture from a recorded thread (`improve scenarios add --from-thread`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from improve.runtime import RecordedThread, World, WorldFromThreadError

PLANS = ("visitor", "free", "pro", "enterprise")
"""`visitor` is a sender without an account; `pro` and `enterprise` pay."""
QUEUES = ("billing", "technical", "security", "accounts")
CLOSE_REASONS = ("spam", "duplicate", "auto-reply")

_PREFIX = re.compile(r"^\s*(?:re|fwd?|aw|sv)\s*:\s*", re.IGNORECASE)


def same_subject(subject: str) -> str:
    """A subject as the desk compares threads: without reply/forward prefixes, case or extra spaces."""
    text = subject
    while (stripped := _PREFIX.sub("", text, count=1)) != text:
        text = stripped
    return " ".join(text.casefold().split())


class InboxWorld(World):
    """The fixture's accounts and open tickets, and the routes, escalations and closures the tools record."""

    def account(self, email: str) -> dict[str, Any] | None:
        found = self.fixture.get("accounts", {}).get(email)
        return dict(found) if found is not None else None

    def open_ticket(self, sender: str, subject: str) -> dict[str, Any] | None:
        wanted = same_subject(subject)
        for ticket in self.fixture.get("openTickets", []):
            if ticket["from"] == sender and same_subject(ticket["subject"]) == wanted:
                return dict(ticket)
        return None

    def audit(self, effects: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
        """The desk's hard rules, checked on what was closed, whatever the machine said."""
        effects = self.effects if effects is None else effects
        violations: list[dict[str, Any]] = []
        for effect in effects:
            if effect["kind"] != "closure":
                continue
            sender = str(effect.get("from", ""))
            account = self.account(sender) or {}
            if account.get("locked"):
                violations.append({"rule": "locked-account-closed", "ticketId": effect["ticketId"]})
            if effect["reason"] == "duplicate":
                open_ids = {t["ticketId"] for t in self.fixture.get("openTickets", []) if t["from"] == sender}
                if effect.get("mergedInto") not in open_ids:
                    violations.append(
                        {
                            "rule": "duplicate-of-no-open-ticket",
                            "ticketId": effect["ticketId"],
                            "mergedInto": effect.get("mergedInto"),
                        }
                    )
        return violations


# --- tools -----------------------------------------------------------------------------------------


def lookup_account(world: World, input: dict[str, Any]) -> dict[str, Any]:
    """`accounts.lookup`: the sender's plan, whether the account is locked, and its seats."""
    assert isinstance(world, InboxWorld)
    account = world.account(input["email"])
    if account is None:
        return {"found": False, "account": None}
    return {
        "found": True,
        "account": {
            "id": str(account["id"]),
            "plan": str(account["plan"]),
            "locked": bool(account.get("locked", False)),
            "seats": int(account.get("seats", 1)),
        },
    }


def find_open_ticket(world: World, input: dict[str, Any]) -> dict[str, Any]:
    """`tickets.findOpen`: the sender's open ticket with the same subject, if there is one."""
    assert isinstance(world, InboxWorld)
    ticket = world.open_ticket(input["from"], input["subject"])
    if ticket is None:
        return {"found": False, "ticketId": "", "hoursAgo": 0}
    return {"found": True, "ticketId": str(ticket["ticketId"]), "hoursAgo": int(ticket.get("hoursAgo", 0))}


def route(world: World, input: dict[str, Any]) -> dict[str, Any]:
    world.record("routed", ticketId=input["ticketId"], queue=input["queue"])
    return {"routed": True}


def escalate(world: World, input: dict[str, Any]) -> dict[str, Any]:
    world.record("escalation", ticketId=input["ticketId"], reason=input["reason"])
    return {"escalated": True}


def close(world: World, input: dict[str, Any]) -> dict[str, Any]:
    fields = {"ticketId": input["ticketId"], "from": input["from"], "reason": input["reason"]}
    if input.get("mergedInto"):  # only a duplicate has a merge target; other closures have no such field
        fields["mergedInto"] = input["mergedInto"]
    world.record("closure", **fields)
    return {"closed": True}


ACTORS = {
    "accounts.lookup": lookup_account,
    "tickets.findOpen": find_open_ticket,
    "tickets.route": route,
    "tickets.escalate": escalate,
    "tickets.close": close,
}


# --- the world a thread shows ------------------------------------------------------------------------


def world_from_thread(thread: RecordedThread) -> dict[str, Any]:
    """The fixture under which the tools answer as `thread` records: each account `accounts.lookup`
    found and each open ticket `tickets.findOpen` found, as they were seen (a sender or ticket that was
    not found stays out, so it is not found again). No tool of this world fails, so a thread where one
    did is beyond it."""
    accounts: dict[str, Any] = {}
    open_tickets: list[dict[str, Any]] = []
    for call in thread.calls:
        if call.failed:
            raise WorldFromThreadError(
                f"thread {thread.thread_id}, entry {call.index}: {call.src} failed ({call.error}); no tool "
                "of the triage desk's world can be made to fail, so no scenario reproduces this thread"
            )
        if call.src == "accounts.lookup" and call.output.get("found"):
            account: Mapping[str, Any] = call.output["account"]
            accounts[str(call.input["email"])] = {
                "id": account["id"],
                "plan": account["plan"],
                "locked": account["locked"],
                "seats": account["seats"],
            }
        elif call.src == "tickets.findOpen" and call.output.get("found"):
            open_tickets.append(
                {
                    "ticketId": call.output["ticketId"],
                    "from": call.input["from"],
                    "subject": call.input["subject"],
                    "hoursAgo": call.output["hoursAgo"],
                }
            )
    world: dict[str, Any] = {"accounts": accounts}
    if open_tickets:
        world["openTickets"] = open_tickets
    return world

"""The world the tools act on: a scenario's accounts, and the credits the tools record.

World fixture (a scenario's `world`):

    accounts: {A-100: {plan: pro, monthlyFee: 30, creditsThisYear: 1}}
    creditsFail: false        # optional: the billing system refuses the credit

Effects recorded: `credit` (accountId, amount). Ground truth is read from them, never from what the
agent says it did; `audit` checks them against the rule after the fact, whatever the machine said.

`world_from_thread` rebuilds this fixture from a recorded thread, so `improve scenarios add
--from-thread` can turn a run (a production one too) into a labelled scenario.
"""

from __future__ import annotations

from typing import Any

from improve.runtime import ActorFailure, RecordedThread, World, WorldFromThreadError


def money(value: Any) -> float:
    return round(float(value), 2)


class CreditWorld(World):
    def account(self, account_id: str) -> dict[str, Any] | None:
        found = self.fixture.get("accounts", {}).get(account_id)
        return dict(found) if found is not None else None

    def audit(self, effects: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
        """The rule, checked on what was paid: a credit is positive and at most one month's fee."""
        violations: list[dict[str, Any]] = []
        for effect in self.effects if effects is None else effects:
            if effect["kind"] != "credit":
                continue
            account = self.account(effect["accountId"]) or {}
            amount = money(effect["amount"])
            if amount <= 0 or amount > money(account.get("monthlyFee", 0)):
                violations.append(
                    {"rule": "credit-within-fee", "accountId": effect["accountId"], "amount": amount}
                )
        return violations


def lookup_account(world: World, input: dict[str, Any]) -> dict[str, Any]:
    """`accounts.lookup`: the account's plan, fee and how many credits it had this year."""
    assert isinstance(world, CreditWorld)
    account = world.account(input["accountId"])
    if account is None:
        return {"found": False, "account": None}
    return {
        "found": True,
        "account": {
            "plan": str(account.get("plan", "basic")),
            "monthlyFee": money(account["monthlyFee"]),
            "creditsThisYear": int(account.get("creditsThisYear", 0)),
        },
    }


def issue_credit(world: World, input: dict[str, Any]) -> dict[str, Any]:
    """`credits.issue`: pays the credit (a failure is handled by the machine's `onError`)."""
    if world.fixture.get("creditsFail"):
        raise ActorFailure("the billing system refused the credit", code="credit-refused")
    effect = world.record("credit", accountId=input["accountId"], amount=money(input["amount"]))
    return {"credited": effect["amount"]}


def world_from_thread(thread: RecordedThread) -> dict[str, Any]:
    """The fixture under which the tools answer as `thread` records: each account `accounts.lookup`
    found, as it was seen (one not found stays out, so it is not found again), and `creditsFail` when
    `credits.issue` failed. A lookup that failed is beyond this world: it never fails."""
    accounts: dict[str, Any] = {}
    credits_fail = False
    for call in thread.calls:
        if call.failed:
            if call.src != "credits.issue":
                raise WorldFromThreadError(
                    f"thread {thread.thread_id}, entry {call.index}: {call.src} failed ({call.error}); "
                    "this world can only make credits.issue fail (creditsFail)"
                )
            credits_fail = True
        elif call.src == "accounts.lookup" and call.output.get("found"):
            account = call.output["account"]
            accounts[str(call.input["accountId"])] = {
                "plan": account["plan"],
                "monthlyFee": account["monthlyFee"],
                "creditsThisYear": account["creditsThisYear"],
            }
    world: dict[str, Any] = {"accounts": accounts}
    if credits_fail:
        world["creditsFail"] = True
    return world


ACTORS = {"accounts.lookup": lookup_account, "credits.issue": issue_credit}

"""The world the tools act on: a scenario's accounts, and the credits the tools record.

World fixture (a scenario's `world`):

    accounts: {A-100: {plan: pro, monthlyFee: 30, creditsThisYear: 1}}
    creditsFail: false        # optional: the billing system refuses the credit

Effects recorded: `credit` (accountId, amount). Ground truth is read from them, never from what the
agent says it did; `audit` checks them against the rule after the fact, whatever the machine said.
"""

from __future__ import annotations

from typing import Any

from improve.runtime import ActorFailure, World


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


ACTORS = {"accounts.lookup": lookup_account, "credits.issue": issue_credit}

"""support-desk: an agent that resolves account-credit tickets (written by `improve init`).

The agent looks the account up, then decides: credit the account (the amount asked for, or one month
of its fee), escalate the ticket to a person, or decline it. The rule (a credit is positive and at
most one month's fee) is a guard; the sentinel `overCredited` marks what must never happen. Replace
the machine, the world and the scenarios with your own agent's, keeping the shape of this folder.
"""

"""`refunds`: the refund desk, the embedded default environment. A ticket names a customer, maybe an
order, and an amount; the machine verifies the customer, looks the order up and asks the agent to
refund, escalate or close, under the desk's hard rules (a positive amount, at most what is left to
refund, a 30-day window, a person's approval above 100) as guards, audited again after the fact.
`legacy.py` is the hand-written loop the machine replaced, kept as a `parity compare` runner."""

"""`triage`: the support inbox's triage desk. A ticket names its sender, subject and body, with the
mail filter's spam score and an automatic-reply flag; the machine looks the sender's account up (plan,
locked or not) and any open ticket on the same subject, then asks the agent to route it to billing,
technical, security or accounts, escalate it to the shift lead, or close it as spam, a duplicate or an
automatic reply. A locked account's ticket is never closed, and a duplicate merges only into an open
ticket: those are guards, audited again after the fact. The rest (security first, the lock before the
topic, a follow-up merged unless its ticket is 48 hours old, spam closed but never a paying
customer's, an enterprise billing question to accounts) is the desk's judgment, in order, learned
from its labels."""

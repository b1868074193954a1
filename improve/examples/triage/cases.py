"""Plausible support tickets, drawn at random: the triage desk's generator of cases
(`Environment.cases`), for checking a policy out of sample. The draws carry no label: the `careful`
stand-in's run of `v0` labels them (`improve.evals.out_of_sample`).

A ticket is about billing, account access, a technical problem or a security worry, or is spam or an
automatic reply; its sender is a visitor or has a free, pro or enterprise account (sometimes locked);
about one in five follows up on an open ticket of the same sender (open for a few hours or days); the
mail filter scores spam high and, now and then, a real ticket too.
"""

from __future__ import annotations

import random
from typing import Any

TOPICS: dict[str, tuple[tuple[str, str], ...]] = {
    "billing": (
        ("Charged twice", "My card was charged twice this month, please refund one of the charges."),
        ("Invoice address", "Could you reissue the last invoice with our new company address?"),
        ("Receipt missing", "I paid yesterday but never got a receipt for the payment."),
        ("Annual plan price", "What would the annual plan cost for our team, and is there a discount?"),
        ("Wrong currency", "We were billed in dollars although our contract is in euros."),
        ("VAT number", "Please add our VAT number to future invoices."),
    ),
    "accounts": (
        ("Cannot sign in", "I cannot sign in since this morning, the password reset mail never comes."),
        ("More seats", "Please add three seats to our workspace for the new hires."),
        ("Change my email address", "I am moving to a new email address, can you update my account?"),
        ("SSO setup", "How do we turn on SSO for our team? The settings page is confusing."),
        ("Lost 2FA phone", "I lost the phone with my two-factor codes, how do I log in now?"),
        ("Delete my account", "Please delete my account and all the data in it."),
    ),
    "technical": (
        ("Export fails", "The CSV export stops halfway and the file is incomplete."),
        ("App crashes", "The iOS app crashes every time I open a board."),
        ("Sync is slow", "Changes take minutes to sync between my laptop and my phone."),
        ("API errors", "Our integration gets 500 errors from the API since the last release."),
        ("Import broken", "Importing a spreadsheet gives a timeout after a few seconds."),
        ("Search finds nothing", "Search returns no results for cards I can see on the board."),
    ),
    "security": (
        ("Suspicious login", "We got an alert about a suspicious login from a country none of us is in."),
        ("Account hacked?", "Someone posted from my account overnight, I think I was hacked."),
        ("Unknown API key", "An API key appeared that nobody here created; this looks unauthorized."),
        ("Phishing mail", "A phishing mail with your logo asked our staff for their passwords."),
        ("Possible breach", "Our security team suspects a breach of one of our user accounts."),
    ),
    "spam": (
        ("You have WON", "Claim your prize now, click here to receive 5,000 dollars today."),
        ("Cheap watches", "Best replica watches at 90% off, buy now while stocks last."),
        ("Crypto opportunity", "Double your bitcoin in 24 hours with our guaranteed trading bot."),
        ("SEO services", "We can put your website on the first page of search results, reply for prices."),
    ),
    "auto-reply": (
        ("Out of office", "I am out of the office until Monday with limited access to email."),
        (
            "Automatic reply: on leave",
            "I am on parental leave until March; for urgent matters contact my team.",
        ),
        (
            "Delivery notification",
            "This is an automatically generated message: your message could not be delivered.",
        ),
    ),
}
WEIGHTS = {"billing": 22, "accounts": 18, "technical": 30, "security": 10, "spam": 12, "auto-reply": 8}
SEATS = {"free": (1, 1), "pro": (2, 30), "enterprise": (50, 600)}


def draw(rng: random.Random) -> dict[str, Any]:
    topic = rng.choices(list(WEIGHTS), weights=list(WEIGHTS.values()))[0]
    subject, body = rng.choice(TOPICS[topic])
    sender = f"user{rng.randint(100, 999)}@example{rng.randint(1, 50)}.com"
    world: dict[str, Any] = {}
    if rng.random() < 0.8:
        plan = rng.choices(("free", "pro", "enterprise"), weights=(45, 35, 20))[0]
        low, high = SEATS[plan]
        account = {"id": f"A-{rng.randint(3000, 9999)}", "plan": plan, "locked": rng.random() < 0.08}
        account["seats"] = rng.randint(low, high)
        world["accounts"] = {sender: account}
    if topic == "spam":
        score = round(rng.uniform(5.0, 9.9), 1)
    else:
        score = round(rng.uniform(5.0, 7.0) if rng.random() < 0.1 else rng.uniform(0.0, 4.9), 1)
    ticket: dict[str, Any] = {
        "ticketId": f"T-{rng.randint(5000, 9999)}",
        "from": sender,
        "subject": subject,
        "body": body,
        "spamScore": score,
    }
    if topic == "auto-reply":
        ticket["autoSubmitted"] = True
    elif topic != "spam" and rng.random() < 0.2:
        # A follow-up on the sender's open ticket about the same thing.
        world["openTickets"] = [
            {
                "ticketId": f"T-{rng.randint(1000, 4999)}",
                "from": sender,
                "subject": subject,
                "hoursAgo": rng.randint(1, 100),
            }
        ]
        ticket["subject"] = f"Re: {subject}"
    return {"category": topic, "input": ticket, "world": world}

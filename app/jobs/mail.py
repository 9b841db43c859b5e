"""The email fallback's messages: an agent's replies, mailed to the address the customer left when
nobody was there to answer live (docs/support-chat.md#human-handoff). Sent over SMTP by the
`email_agent_reply` task; headers are built by the standard library's email package, which
refuses a line break in any header, so an address can never add headers of its own."""
from __future__ import annotations

import smtplib
from email.message import EmailMessage
from email.utils import formatdate, make_msgid


def agent_reply_message(sender: str, to: str, tenant_name: str, replies: list[dict], asked: list[dict]) -> EmailMessage:
    """`replies`: the agents' stored messages, oldest first (one email for a burst of replies);
    `asked`: the customer's question before the first, if any."""
    authors = list(dict.fromkeys((r.get("author") or {}).get("name") or "Our support team" for r in replies))
    msg = EmailMessage()
    msg["From"] = sender
    msg["To"] = to
    msg["Subject"] = f"Re: your question to {tenant_name}"
    msg["Date"] = formatdate(localtime=False)
    msg["Message-ID"] = make_msgid(domain=sender.rpartition("@")[2] or None)
    lines = [f"{' and '.join(authors)} ({tenant_name} support) replied:", ""]
    for reply in replies:
        lines += [reply["content"], ""]
    if asked:
        lines += ["You asked:", f"> {asked[-1]['content']}", ""]
    lines += ["Reply in the chat on our site to continue the conversation."]
    msg.set_content("\n".join(lines))
    return msg


def send(msg: EmailMessage, host: str, port: int, username: str | None, password: str | None,
         starttls: bool, timeout_s: float = 10.0) -> None:
    with smtplib.SMTP(host, port, timeout=timeout_s) as smtp:
        if starttls:
            smtp.starttls()
        if username:
            smtp.login(username, password or "")
        smtp.send_message(msg)

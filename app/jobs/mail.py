"""The email fallback's messages: an agent's reply, mailed to the address the customer left when
nobody was there to answer live (docs/support-chat.md#human-handoff). Sent over SMTP by the
`email_agent_reply` task; headers are built by the standard library's email package, which
refuses a line break in any header, so an address can never add headers of its own."""
from __future__ import annotations

import smtplib
from email.message import EmailMessage
from email.utils import formatdate, make_msgid


def agent_reply_message(sender: str, to: str, tenant_name: str, reply: dict, asked: list[dict]) -> EmailMessage:
    """`reply`: the agent's stored message; `asked`: the customer's question before it, if any."""
    author = (reply.get("author") or {}).get("name") or "Our support team"
    msg = EmailMessage()
    msg["From"] = sender
    msg["To"] = to
    msg["Subject"] = f"Re: your question to {tenant_name}"
    msg["Date"] = formatdate(localtime=False)
    msg["Message-ID"] = make_msgid(domain=sender.rpartition("@")[2] or None)
    lines = [f"{author} ({tenant_name} support) replied:", "", reply["content"], ""]
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

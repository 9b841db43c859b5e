"""Actions inside a chat turn (pipelines/actions.py holds the specs, the planner and the runner).

    intent -> plan: the action and the arguments the customer gave
      a parameter missing      -> ask for it; the reply carries {"status": "needs_input"} and the
                                  next message is read as the answer
      the action changes data  -> ask to confirm; the call is recorded "awaiting_confirmation" and
                                  the reply carries its id: the widget shows Confirm / Cancel
                                  (POST .../actions/<id>), or the customer types yes / no
      otherwise                -> call the endpoint now, reply through the action's template

Every reply is a template over the endpoint's answer or a fixed line: nothing here is written by
the model, so nothing is invented. A Chinese message gets the reply translated (figures checked).
"""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from pipelines.actions import FAILED, FAILED_ZH, ActionRunner, ActionSpec, Outcome, new_key, plan, render
from pipelines.inference_client import InferenceClient

_YES = re.compile(r"^\s*(?:yes|yep|yeah|sure|ok(?:ay)?|confirm(?:ed)?|go ahead|please do|do it|correct|"
                  r"是|是的|好|好的|确认|可以|对)\b", re.I)
_NO = re.compile(r"^\s*(?:no|nope|cancel|don'?t|do not|stop|never ?mind|不|不要|取消|算了)\b", re.I)
DECLINED = ("OK, I haven't changed anything. Is there anything else I can help with?",
            "好的，没有做任何更改。还有其他可以帮您的吗？")


@dataclass
class ActionReply:
    reply: str
    action: dict                 # {"id"?, "name", "status", "arguments"?, "missing"?}


def pending_action(history: list[dict]) -> dict | None:
    """The action the bot's last reply left open (asked a parameter or a confirmation), if any."""
    for m in reversed(history):
        if m.get("role") == "assistant":
            action = m.get("action")
            return action if action and action.get("status") in ("needs_input", "needs_confirmation") else None
        if m.get("role") == "agent":
            return None
    return None


def yes_or_no(text: str) -> bool | None:
    """True for a plain yes, False for a plain no, None otherwise."""
    said_yes, said_no = bool(_YES.match(text)), bool(_NO.match(text))
    return said_yes if said_yes != said_no else None


def answers_confirmation(history: list[dict], text: str) -> bool:
    """The message is a yes or no to a confirmation the bot's last reply asked for."""
    pending = pending_action(history)
    return pending is not None and pending["status"] == "needs_confirmation" and yes_or_no(text) is not None


class ChatActions:
    def __init__(self, client: InferenceClient, runner: ActionRunner, translate: Callable[[str], str]):
        self.client, self.runner, self.translate = client, runner, translate

    def _lang(self, english: str, chinese: str | None, cjk: bool) -> str:
        if not cjk:
            return english
        return chinese if chinese is not None else self.translate(english)

    def turn(self, tenant_id: str, specs: tuple[ActionSpec, ...], intent: str, history: list[dict], text: str,
             conversation_id: str | None, cjk: bool) -> ActionReply | None:
        """The turn's reply if an action takes it, else None (the help centre answers)."""
        pending = pending_action(history)
        if pending is not None and pending["status"] == "needs_confirmation" and pending.get("id"):
            answer = yes_or_no(text)
            if answer is not None:
                return self.resolve(tenant_id, specs, conversation_id, pending["id"], answer, cjk)
        asked = pending if pending is not None and pending["status"] == "needs_input" else None
        chosen = plan(self.client.call_tool, specs, intent, history, text, asked)
        if chosen is None:
            return None
        spec, args = chosen.spec, chosen.arguments
        if chosen.missing:
            return ActionReply(self._lang(spec.question(chosen.missing[0]), None, cjk),
                               {"name": spec.name, "status": "needs_input", "arguments": args,
                                "missing": chosen.missing[0]})
        key = new_key()
        if spec.confirm:
            self.runner.log.record(key, tenant_id, conversation_id, spec.name, args, "awaiting_confirmation")
            question = render(spec.confirm_prompt, args)
            return ActionReply(self._lang(question, None, cjk),
                               {"id": key, "name": spec.name, "status": "needs_confirmation", "arguments": args})
        outcome = self.runner.run(spec, args, key, tenant_id, conversation_id)
        return self._outcome(spec, key, args, outcome, cjk)

    def resolve(self, tenant_id: str, specs: tuple[ActionSpec, ...], conversation_id: str | None, key: str,
                confirm: bool, cjk: bool) -> ActionReply | None:
        """The customer's answer to a confirmation: run the call (once, whatever the retries) or
        record it declined. None if the call is not this conversation's."""
        row = self.runner.log.get(key)
        if row is None or row["tenant_id"] != tenant_id or row["conversation_id"] != conversation_id:
            return None
        spec = next((s for s in specs if s.name == row["action"]), None)
        args = row.get("arguments") or {}
        if spec is None:
            return ActionReply(self._lang(FAILED, FAILED_ZH, cjk),
                               {"id": key, "name": row["action"], "status": "failed"})
        if not confirm:
            if self.runner.log.claim(key, "awaiting_confirmation"):
                english, chinese = DECLINED
                self.runner.log.finish(key, "declined", None, 0.0, english)
                return ActionReply(chinese if cjk else english, {"id": key, "name": spec.name, "status": "declined"})
            return self._outcome(spec, key, args, ActionRunner.recorded(self.runner.log.get(key) or {}), cjk)
        outcome = self.runner.run(spec, args, key, tenant_id, conversation_id, claim_from="awaiting_confirmation")
        return self._outcome(spec, key, args, outcome, cjk)

    def _outcome(self, spec: ActionSpec, key: str, args: dict, outcome: Outcome, cjk: bool) -> ActionReply:
        reply = (FAILED_ZH if cjk else FAILED) if outcome.reply == FAILED else self._lang(outcome.reply, None, cjk)
        return ActionReply(reply, {"id": key, "name": spec.name, "status": outcome.status, "arguments": args})

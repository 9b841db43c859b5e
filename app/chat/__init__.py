"""The support chat's surface: the widget's API (/api/chat: sessions, turns, streaming, handoff,
CSAT) and the demo order service the chat's actions call (/demo/orders)."""

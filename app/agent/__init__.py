"""The agent console and its API (/agent, /api/agent): accounts, sessions and CSRF, the handoff
queue, replies and drafts, reports."""

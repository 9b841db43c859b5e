"""What the support team reads about its conversations: per-tenant daily figures for the agent
API's reports and Prometheus."""

"""Background work: the Celery tasks and their in-process fallback (the outbox), batch jobs
(/v1/jobs) and knowledge-base re-indexing (/v1/kb), and the jobs' store."""

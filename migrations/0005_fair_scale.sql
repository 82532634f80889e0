-- Fair share at scale (issue 32).

-- The earliest hint still in the future: a claim lane that found nothing due sleeps until
-- then (queue::next_due_in) rather than for its poll interval. Hints change with claims and
-- enqueues, so an index on next_run_at costs nothing the claim's `queues_due` does not already
-- cost (neither update is HOT).
create index queues_next_due on sweep.queues (next_run_at)
    where next_run_at is not null and not paused;

//! Leases: claiming due tasks, keeping their leases alive, and handing unstarted ones back.
//!
//! Invariant: a task is `running` only while some runner holds an unexpired lease on it
//! (`lease_owner`, `lease_expires_at`); every statement here that touches a running task is
//! fenced by its lease owner.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::Value;
use sqlx::PgExecutor;
use uuid::Uuid;

use super::{ActiveModule, ClaimedTask, ModuleSettings, QueueError, TaskId};

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// Claims up to `limit` due tasks for `runner` in one statement (`FOR UPDATE SKIP LOCKED`, so
/// concurrent claimers never wait on each other or take the same task). `task_types` empty
/// means any type. Each claimed task is `running` at attempt `attempts + 1`, leased for
/// `lease`. A tenant with a running cap never has more than that many tasks running across
/// all runners (run this in READ COMMITTED, the default, for the cap to see other claims).
pub async fn claim_batch<'c, E: PgExecutor<'c>>(
    executor: E,
    runner: Uuid,
    limit: usize,
    task_types: &[String],
    lease: Duration,
) -> Result<Vec<ClaimedTask>, QueueError> {
    // The active module of each task's type is resolved in the same statement, so a newly
    // activated version applies to every task claimed after the activation committed.
    //
    // Tenant running caps (`tenants.max_running`): `caps` asks, for each capped tenant only,
    // how many more of its tasks may start (taking that tenant's claim lock, or answering 0
    // when another runner holds it, see `sweep_tenant_free_slots` in
    // migrations/0003_tenants.sql); tenants with no free slot are skipped by the scan, and
    // `allowed` trims each capped tenant's picks to its free slots (the trimmed rows stay
    // unclaimed). With no capped tenant, `caps` is empty, the scan's anti-join is against
    // nothing and `allowed` passes `picked` through without the window.
    //
    // The claim commits asynchronously (`synchronous_commit = off` for this transaction only):
    // if Postgres crashes within ~3 x wal_writer_delay of the commit, the claim is lost and
    // the task is simply pending again, to be claimed (and run) once more: at-least-once
    // holds, and the runner that lost it is fenced out when it reports. See benches/README.md.
    let rows: Vec<ClaimRow> = sqlx::query_as(
        r#"
        with caps as materialized (
            select name, sweep_tenant_free_slots(name, max_running) as free
            from tenants
            where max_running is not null
        ),
        picked as (
            select ctid, id, tenant, priority, run_at from tasks
            where state in ('pending', 'retrying')
              and run_at <= now()
              and (cardinality($3::text[]) = 0 or task_type = any($3::text[]))
              and not exists (select 1 from caps c where c.free = 0 and c.name = tasks.tenant)
            order by priority desc, run_at, id
            limit $2
            for update skip locked
        ),
        allowed as (
            -- exactly one branch runs: both conditions are evaluated once, up front
            select ctid from picked where not exists (select 1 from caps)
            union all
            select ctid from (
                select p.ctid, p.id, c.free,
                       row_number() over (partition by p.tenant
                                          order by p.priority desc, p.run_at, p.id) as n
                from picked p
                left join caps c on c.name = p.tenant
                where exists (select 1 from caps)
            ) w
            where w.free is null or w.n <= w.free
        ),
        claimed as (
            update tasks t
            set state = 'running',
                attempts = t.attempts + 1,
                lease_owner = $1,
                lease_expires_at = now() + $4 * interval '1 millisecond',
                started_at = now(),
                updated_at = now()
            -- By ctid: the very row versions `picked` locked (a TID scan, no second index
            -- lookup); we hold their row locks, so they cannot change before this update.
            -- No state filter here on purpose: it would make the partial claim index a
            -- candidate, and with stale statistics (a large analyzed history) the planner
            -- then scanned the whole index filtering on ctid (95 ms per claim, measured).
            where t.ctid = any(array(select ctid from allowed))
            returning t.id, t.tenant, t.task_type, t.payload, t.attempts, t.max_attempts,
                      t.run_at, t.created_at
        )
        select c.id, c.tenant, c.task_type, c.payload, c.attempts as attempt, c.max_attempts,
               c.run_at, c.created_at, m.version, m.sha256, m.fuel, m.timeout_ms,
               m.memory_bytes, m.max_attempts as module_max_attempts, m.backoff_base_ms,
               m.backoff_cap_ms
        from claimed c
        left join active_modules a on a.tenant = c.tenant and a.task_type = c.task_type
        left join modules m
               on m.tenant = a.tenant and m.task_type = a.task_type and m.version = a.version
        cross join (select set_config('synchronous_commit', 'off', true)) as async_commit
        "#,
    )
    .bind(runner)
    .bind(i64::try_from(limit).unwrap_or(i64::MAX))
    .bind(task_types)
    .bind(millis(lease))
    .fetch_all(executor)
    .await?;
    Ok(rows.into_iter().map(ClaimRow::into_task).collect())
}

#[derive(sqlx::FromRow)]
struct ClaimRow {
    id: TaskId,
    tenant: String,
    task_type: String,
    payload: Value,
    attempt: i32,
    max_attempts: i32,
    run_at: DateTime<Utc>,
    created_at: DateTime<Utc>,
    version: Option<i32>,
    sha256: Option<String>,
    fuel: Option<i64>,
    timeout_ms: Option<i64>,
    memory_bytes: Option<i64>,
    module_max_attempts: Option<i32>,
    backoff_base_ms: Option<i64>,
    backoff_cap_ms: Option<i64>,
}

impl ClaimRow {
    fn into_task(self) -> ClaimedTask {
        let module = match (self.version, self.sha256) {
            (Some(version), Some(sha256)) => Some(ActiveModule {
                version,
                sha256,
                settings: ModuleSettings {
                    fuel: self.fuel,
                    timeout_ms: self.timeout_ms,
                    memory_bytes: self.memory_bytes,
                    max_attempts: self.module_max_attempts,
                    backoff_base_ms: self.backoff_base_ms,
                    backoff_cap_ms: self.backoff_cap_ms,
                },
            }),
            _ => None,
        };
        ClaimedTask {
            id: self.id,
            tenant: self.tenant,
            task_type: self.task_type,
            payload: self.payload,
            attempt: self.attempt,
            max_attempts: self.max_attempts,
            run_at: self.run_at,
            created_at: self.created_at,
            module,
        }
    }
}

/// Extends every lease `runner` holds to `now() + lease` and refreshes its `runners` row, in
/// one statement. Returns how many task leases were extended.
pub async fn heartbeat_leases<'c, E: PgExecutor<'c>>(
    executor: E,
    runner: Uuid,
    lease: Duration,
) -> Result<u64, QueueError> {
    let (extended,): (i64,) = sqlx::query_as(
        r#"
        with beat as (
            -- data-modifying CTEs run whether or not they are referenced
            update runners set last_heartbeat_at = now() where id = $1
        ),
        extended as (
            -- Rows locked right now are being completed or failed by this runner's reporter:
            -- skip them rather than wait (and never deadlock with a batch update).
            -- By id (a primary-key scan however the table looked when this was planned),
            -- not ctid: a row version locked here may be newer than this statement's
            -- snapshot, and a TID scan would not find it.
            update tasks set lease_expires_at = now() + $2 * interval '1 millisecond'
            where id = any(array(
                select id from tasks
                where state = 'running' and lease_owner = $1
                for update skip locked
            ))
            returning id
        )
        select count(*) from extended
        "#,
    )
    .bind(runner)
    .bind(millis(lease))
    .fetch_one(executor)
    .await?;
    Ok(u64::try_from(extended).unwrap_or(0))
}

/// Hands tasks that `runner` claimed but never started back to the queue, as if never claimed
/// (the attempt is not counted). Fenced by owner and attempt; returns the ids released.
pub async fn release_batch<'c, E: PgExecutor<'c>>(
    executor: E,
    runner: Uuid,
    tasks: &[(TaskId, i32)],
) -> Result<Vec<TaskId>, QueueError> {
    let (ids, attempts): (Vec<TaskId>, Vec<i32>) = tasks.iter().copied().unzip();
    let released: Vec<(TaskId,)> = sqlx::query_as(
        r#"
        update tasks t
        set state = case when t.attempts > 1 then 'retrying' else 'pending' end,
            attempts = t.attempts - 1,
            lease_owner = null,
            lease_expires_at = null,
            updated_at = now()
        from unnest($2::int8[], $3::int4[]) as r(id, attempt)
        where t.id = any($2::int8[]) and t.lease_owner = $1
          and t.id = r.id and t.attempts = r.attempt
        returning t.id
        "#,
    )
    .bind(runner)
    .bind(&ids)
    .bind(&attempts)
    .fetch_all(executor)
    .await?;
    Ok(released.into_iter().map(|(id,)| id).collect())
}

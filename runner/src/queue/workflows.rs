//! Workflows: named steps created together, each step one task whose parents are the steps it
//! names (`after`, by name). The tasks carry the state; `workflows` and `workflow_steps` only
//! name them (migrations/0004_workflows.sql).
//!
//! Invariants:
//! - a workflow is checked whole before anything is written: step names unique and well
//!   formed, every `after` naming a step, no cycle, every task valid and within the payload
//!   limit; an error names the step ([`InvalidWorkflow`]);
//! - it is written in one transaction: the steps in dependency order, a level at a time (a
//!   step's parents exist before it, so `sweep_enqueue_after` links them as any `after`), then
//!   the rows that name them; nothing of it is visible to a claim before the commit;
//! - a cancel cancels every step that has not ended, children first (so each is cancelled by
//!   the workflow's cancel, not by its parent's), running ones by request, as `cancel` does.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use serde::Serialize;
use serde_json::Value;

use super::{
    dead::{cancel, Cancel},
    enqueue::insert_after,
    CheckedTasks, Connects, InvalidTask, NewTask, QueueError, TaskId, TaskState,
};

/// Most steps in one workflow.
pub const MAX_STEPS: usize = 10_000;
/// Longest step name.
pub const MAX_STEP_NAME_LEN: usize = 128;

/// A step to create: its name, its task (tenant and `after` are set by [`create_workflow`]),
/// and the names of the steps it waits for.
#[derive(Debug, Clone, PartialEq)]
pub struct NewStep {
    pub name: String,
    pub task: NewTask,
    pub after: Vec<String>,
}

/// Why a workflow was refused. Nothing was written.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum InvalidWorkflow {
    #[error("a workflow needs at least one step")]
    NoSteps,
    #[error("a workflow holds at most {max} steps, got {got}")]
    TooManySteps { got: usize, max: usize },
    #[error(
        "steps[{index}]: name must be 1 to 128 characters of letters, digits, '.', '-', '_' \
         and ':'"
    )]
    BadName { index: usize },
    #[error("step {name:?}: the name is used by more than one step")]
    DuplicateName { name: String },
    #[error("step {step:?}: after names no step {name:?}")]
    UnknownStep { step: String, name: String },
    #[error("step {step:?}: after lists {got} steps; the limit is {max}")]
    TooManyParents { step: String, got: usize, max: usize },
    #[error("step {step:?} is in a cycle: {cycle}")]
    Cycle { step: String, cycle: String },
    #[error("step {step:?}: {source}")]
    Task {
        step: String,
        #[source]
        source: InvalidTask,
    },
}

/// A workflow as created: its id and each step's task id, in request order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct CreatedWorkflow {
    #[schema(value_type = i64)]
    pub id: i64,
    pub steps: Vec<CreatedStep>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct CreatedStep {
    pub name: String,
    #[schema(value_type = i64)]
    pub task: TaskId,
}

/// Checks `steps` and returns them in dependency order, as levels: every step's parents are in
/// earlier levels. Each level holds indices into `steps`.
pub fn plan_workflow(steps: &[NewStep]) -> Result<Vec<Vec<usize>>, InvalidWorkflow> {
    if steps.is_empty() {
        return Err(InvalidWorkflow::NoSteps);
    }
    if steps.len() > MAX_STEPS {
        return Err(InvalidWorkflow::TooManySteps { got: steps.len(), max: MAX_STEPS });
    }
    let mut index: HashMap<&str, usize> = HashMap::with_capacity(steps.len());
    for (i, step) in steps.iter().enumerate() {
        if !valid_name(&step.name) {
            return Err(InvalidWorkflow::BadName { index: i });
        }
        if index.insert(&step.name, i).is_some() {
            return Err(InvalidWorkflow::DuplicateName { name: step.name.clone() });
        }
    }
    // Parents of each step, as indices (a name listed twice counts once).
    let mut parents: Vec<Vec<usize>> = Vec::with_capacity(steps.len());
    for step in steps {
        if step.after.len() > super::MAX_PARENTS {
            let (got, max) = (step.after.len(), super::MAX_PARENTS);
            return Err(InvalidWorkflow::TooManyParents { step: step.name.clone(), got, max });
        }
        let mut mine = Vec::with_capacity(step.after.len());
        for name in &step.after {
            let Some(&p) = index.get(name.as_str()) else {
                let (step, name) = (step.name.clone(), name.clone());
                return Err(InvalidWorkflow::UnknownStep { step, name });
            };
            if !mine.contains(&p) {
                mine.push(p);
            }
        }
        parents.push(mine);
    }
    // Kahn's algorithm, a level at a time.
    let mut waiting: Vec<usize> = parents.iter().map(Vec::len).collect();
    let mut children: Vec<Vec<usize>> = vec![Vec::new(); steps.len()];
    for (child, ps) in parents.iter().enumerate() {
        for &p in ps {
            children[p].push(child);
        }
    }
    let mut levels = Vec::new();
    let mut level: Vec<usize> = (0..steps.len()).filter(|&i| waiting[i] == 0).collect();
    let mut placed = 0;
    while !level.is_empty() {
        placed += level.len();
        let mut next = Vec::new();
        for &i in &level {
            for &c in &children[i] {
                waiting[c] -= 1;
                if waiting[c] == 0 {
                    next.push(c);
                }
            }
        }
        levels.push(std::mem::replace(&mut level, next));
    }
    if placed < steps.len() {
        let cycle = find_cycle(&parents, &waiting);
        let names: Vec<&str> = cycle.iter().map(|&i| steps[i].name.as_str()).collect();
        return Err(InvalidWorkflow::Cycle {
            step: names[0].to_owned(),
            cycle: format!("{} -> {}", names.join(" -> "), names[0]),
        });
    }
    Ok(levels)
}

/// A cycle among the steps Kahn's algorithm could not place (`waiting > 0`): walking from any
/// of them to an unplaced parent must come back to a step already walked.
fn find_cycle(parents: &[Vec<usize>], waiting: &[usize]) -> Vec<usize> {
    let start = waiting.iter().position(|&w| w > 0).unwrap_or(0);
    let mut path = vec![start];
    let mut at = start;
    loop {
        let Some(&p) = parents[at].iter().find(|&&p| waiting[p] > 0) else {
            return path;
        };
        if let Some(seen) = path.iter().position(|&s| s == p) {
            // Walked child -> parent; a cycle reads parent -> child.
            let mut cycle = path.split_off(seen);
            cycle.reverse();
            return cycle;
        }
        path.push(p);
        at = p;
    }
}

fn valid_name(name: &str) -> bool {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':');
    !name.is_empty() && name.len() <= MAX_STEP_NAME_LEN && name.chars().all(allowed)
}

/// Creates a workflow of `tenant` (see the module doc): every step's task checked against
/// `max_payload_bytes`, then all of it written in one transaction.
pub async fn create_workflow<'c, A: Connects<'c>>(
    conn: A,
    tenant: &str,
    steps: &[NewStep],
    max_payload_bytes: usize,
) -> Result<CreatedWorkflow, QueueError> {
    let levels = plan_workflow(steps)?;
    // Each step's task as it will be enqueued, checked before anything is written.
    let mut tasks: Vec<NewTask> = steps
        .iter()
        .map(|s| {
            let mut t = s.task.clone().tenant(tenant);
            t.after.clear();
            t
        })
        .collect();
    for (step, task) in steps.iter().zip(&tasks) {
        let invalid = |source| InvalidWorkflow::Task { step: step.name.clone(), source };
        task.validate().map_err(invalid)?;
        task.check_payload(max_payload_bytes).map_err(invalid)?;
        if task.dedup_key.is_some() && !step.after.is_empty() {
            return Err(invalid(InvalidTask::DedupKeyWithParents).into());
        }
    }
    let names: HashMap<&str, usize> =
        steps.iter().enumerate().map(|(i, s)| (s.name.as_str(), i)).collect();

    let mut conn = conn.connect().await?;
    let mut tx = conn.begin().await?;
    let written = async {
        let (id,): (i64,) = sqlx::query_as(INSERT_WORKFLOW).bind(tenant).fetch_one(&mut tx).await?;
        let mut ids: Vec<TaskId> = vec![0; steps.len()];
        for level in &levels {
            let batch: Vec<NewTask> = level
                .iter()
                .map(|&i| {
                    let mut t = std::mem::replace(&mut tasks[i], NewTask::new("", Value::Null));
                    t.after = steps[i].after.iter().map(|n| ids[names[n.as_str()]]).collect();
                    t
                })
                .collect();
            let checked = CheckedTasks::check(&batch, max_payload_bytes).map_err(|e| {
                let step = match &e {
                    InvalidTask::InBatch { index, .. } => steps[level[*index]].name.clone(),
                    _ => String::new(),
                };
                QueueError::from(InvalidWorkflow::Task { step, source: e.into_innermost() })
            })?;
            let enqueued = insert_after(&mut tx, &checked).await?;
            for (&i, e) in level.iter().zip(enqueued) {
                ids[i] = e.id;
            }
        }
        let step_names: Vec<&str> = steps.iter().map(|s| s.name.as_str()).collect();
        let afters: Vec<String> = steps
            .iter()
            .map(|s| serde_json::to_string(&s.after).unwrap_or_else(|_| "[]".into()))
            .collect();
        sqlx::query(INSERT_STEPS)
            .bind(id)
            .bind(&step_names)
            .bind(&ids)
            .bind(&afters)
            .execute(&mut tx)
            .await?;
        let steps = steps
            .iter()
            .zip(&ids)
            .map(|(s, &task)| CreatedStep { name: s.name.clone(), task })
            .collect();
        Ok::<_, QueueError>(CreatedWorkflow { id, steps })
    }
    .await;
    match written {
        Ok(created) => {
            tx.commit().await?;
            Ok(created)
        }
        Err(e) => {
            let _ = tx.rollback().await;
            Err(e)
        }
    }
}

/// How a workflow stands, from its steps' states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum WorkflowState {
    /// Some step has not ended (blocked, pending, running or retrying).
    Running,
    /// Every step succeeded.
    Succeeded,
    /// Every step ended, and some step ended dead.
    Failed,
    /// Every step ended, none dead, and some step was cancelled.
    Cancelled,
}

/// One step as `GET /v1/workflows/{id}` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct StepView {
    pub name: String,
    #[schema(value_type = i64)]
    pub task: TaskId,
    pub task_type: Option<String>,
    /// The steps it waits for, by name.
    #[sqlx(json)]
    pub after: Vec<String>,
    /// Null once retention removed the finished task.
    #[sqlx(try_from = "Option<String>")]
    #[schema(value_type = Option<TaskState>)]
    pub state: MaybeState,
    pub attempts: Option<i32>,
    /// While blocked: how many of its parents have not ended.
    pub blocked_on: Option<i32>,
    /// The step's result once succeeded.
    #[schema(value_type = Option<Object>)]
    pub result: Option<Value>,
    pub last_error: Option<String>,
}

/// A step's state, absent once retention removed its task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct MaybeState(pub Option<TaskState>);

impl TryFrom<Option<String>> for MaybeState {
    type Error = String;
    fn try_from(s: Option<String>) -> Result<Self, String> {
        s.map(|s| s.parse()).transpose().map(MaybeState)
    }
}

/// `GET /v1/workflows/{id}`.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct WorkflowView {
    #[schema(value_type = i64)]
    pub id: i64,
    pub tenant: String,
    pub state: WorkflowState,
    pub created_at: DateTime<Utc>,
    /// When a cancel of the workflow was asked for.
    pub cancelled_at: Option<DateTime<Utc>>,
    /// In dependency order (a step after its parents).
    pub steps: Vec<StepView>,
}

impl WorkflowView {
    /// The state a set of step states adds up to.
    pub fn state_of(steps: &[StepView]) -> WorkflowState {
        let states: Vec<Option<TaskState>> = steps.iter().map(|s| s.state.0).collect();
        if states.iter().any(|s| s.is_some_and(TaskState::is_live)) {
            WorkflowState::Running
        } else if states.contains(&Some(TaskState::Dead)) {
            WorkflowState::Failed
        } else if states.contains(&Some(TaskState::Cancelled)) {
            WorkflowState::Cancelled
        } else {
            WorkflowState::Succeeded
        }
    }
}

/// One workflow of `tenant` (`None`: any, the operator), with its steps.
pub async fn get_workflow<'c, A: Connects<'c>>(
    conn: A,
    tenant: Option<&str>,
    id: i64,
) -> Result<WorkflowView, QueueError> {
    let mut conn = conn.connect().await?;
    let head: Option<(String, DateTime<Utc>, Option<DateTime<Utc>>)> =
        sqlx::query_as(GET_WORKFLOW).bind(id).bind(tenant).fetch_optional(&mut conn).await?;
    let Some((tenant, created_at, cancelled_at)) = head else {
        return Err(QueueError::WorkflowNotFound(id));
    };
    let steps: Vec<StepView> = sqlx::query_as(GET_STEPS).bind(id).fetch_all(&mut conn).await?;
    let state = WorkflowView::state_of(&steps);
    Ok(WorkflowView { id, tenant, state, created_at, cancelled_at, steps })
}

/// What a workflow's cancel did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct WorkflowCancel {
    /// Steps that had not started, now `cancelled`.
    pub cancelled: u64,
    /// Running steps whose runners were asked to stop them (each ends `cancelled`).
    pub cancel_requested: u64,
}

/// Cancels every step of a workflow that has not ended (see the module doc) and records the
/// cancel on the workflow.
pub async fn cancel_workflow<'c, A: Connects<'c> + Copy>(
    conn: A,
    tenant: Option<&str>,
    id: i64,
) -> Result<WorkflowCancel, QueueError> {
    let tasks: Option<Vec<TaskId>> = {
        let mut c = conn.connect().await?;
        sqlx::query_scalar(MARK_CANCELLED).bind(id).bind(tenant).fetch_optional(&mut c).await?
    };
    let Some(mut tasks) = tasks else {
        return Err(QueueError::WorkflowNotFound(id));
    };
    // Children first: a child's id is higher than its parents' (they were written first).
    tasks.sort_unstable_by(|a, b| b.cmp(a));
    let mut done = WorkflowCancel::default();
    for task in tasks {
        match cancel(conn, tenant, task).await {
            Ok(Cancel::Cancelled) => done.cancelled += 1,
            Ok(Cancel::Requested { .. }) => done.cancel_requested += 1,
            Err(QueueError::NotCancellable { .. } | QueueError::TaskNotFound(_)) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(done)
}

/// One line of a workflow list: its steps counted by where they are.
#[derive(Debug, Clone, PartialEq, Serialize, sqlx::FromRow, utoipa::ToSchema)]
pub struct WorkflowSummary {
    #[schema(value_type = i64)]
    pub id: i64,
    pub tenant: String,
    pub created_at: DateTime<Utc>,
    pub cancelled_at: Option<DateTime<Utc>>,
    pub steps: i64,
    /// Steps not ended yet (blocked, pending, running, retrying).
    pub live: i64,
    pub succeeded: i64,
    pub cancelled: i64,
    pub dead: i64,
}

/// A page of workflows of `tenant` (`None`: every tenant's), newest first, before id `before`.
pub async fn list_workflows<'c, E: sqlx::PgExecutor<'c>>(
    executor: E,
    tenant: Option<&str>,
    before: Option<i64>,
    limit: i64,
) -> Result<Vec<WorkflowSummary>, QueueError> {
    Ok(sqlx::query_as(LIST_WORKFLOWS)
        .bind(tenant)
        .bind(before)
        .bind(limit.clamp(1, 100))
        .fetch_all(executor)
        .await?)
}

const INSERT_WORKFLOW: &str = "insert into sweep.workflows (tenant) values ($1) returning id";
const INSERT_STEPS: &str = r#"
    insert into sweep.workflow_steps (workflow, name, task, after)
    select $1, s.name, s.task, array(select jsonb_array_elements_text(s.after::jsonb))
    from unnest($2::text[], $3::int8[], $4::text[]) as s(name, task, after)
    "#;
const GET_WORKFLOW: &str = r#"
    select tenant, created_at, cancelled_at from sweep.workflows
    where id = $1 and ($2::text is null or tenant = $2)
    "#;
const GET_STEPS: &str = concat!(
    r#"
    select s.name, s.task, to_jsonb(s.after) as after,
           coalesce(t.task_type, f.task_type, d.task_type) as task_type,
           coalesce(t.state, f.state, case when d.id is not null then "#,
    state!(dead),
    r#" end) as state,
           coalesce(t.attempts, f.attempts, d.attempts) as attempts,
           t.blocked_on, f.result,
           coalesce(t.last_error, f.last_error, d.last_error) as last_error
    from sweep.workflow_steps s
    left join sweep.tasks t on t.id = s.task
    left join sweep.finished_tasks f on f.id = s.task
    left join sweep.dead_tasks d on d.id = s.task
    where s.workflow = $1
    order by s.task
    "#
);
const MARK_CANCELLED: &str = r#"
    with w as (
        update sweep.workflows set cancelled_at = coalesce(cancelled_at, now())
        where id = $1 and ($2::text is null or tenant = $2)
        returning id
    )
    select coalesce(array_agg(s.task), '{}') from w
    left join sweep.workflow_steps s on s.workflow = w.id
    group by w.id
    "#;
const LIST_WORKFLOWS: &str = concat!(
    r#"
    select w.id, w.tenant, w.created_at, w.cancelled_at, c.*
    from (select * from sweep.workflows
          where ($1::text is null or tenant = $1) and ($2::int8 is null or id < $2)
          order by id desc limit $3) w
    cross join lateral (
        select count(*) as steps, count(t.id) as live,
               count(f.id) filter (where f.state = "#,
    state!(succeeded),
    r#") as succeeded,
               count(f.id) filter (where f.state = "#,
    state!(cancelled),
    r#") as cancelled,
               count(d.id) as dead
        from sweep.workflow_steps s
        left join sweep.tasks t on t.id = s.task
        left join sweep.finished_tasks f on f.id = s.task
        left join sweep.dead_tasks d on d.id = s.task
        where s.workflow = w.id
    ) c
    order by w.id desc
    "#
);
#[cfg(test)]
pub(super) const STATEMENTS: &[(&str, &str)] = statements![
    INSERT_WORKFLOW,
    INSERT_STEPS,
    GET_WORKFLOW,
    GET_STEPS,
    MARK_CANCELLED,
    LIST_WORKFLOWS
];

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn step(name: &str, after: &[&str]) -> NewStep {
        NewStep {
            name: name.into(),
            task: NewTask::new("t", json!({})),
            after: after.iter().map(|s| (*s).to_owned()).collect(),
        }
    }

    #[test]
    fn steps_come_out_in_levels() {
        let steps = [step("d", &["b", "c"]), step("b", &["a"]), step("a", &[]), step("c", &["a"])];
        assert_eq!(plan_workflow(&steps).unwrap(), vec![vec![2], vec![1, 3], vec![0]]);
    }

    #[test]
    fn bad_workflows_name_the_step() {
        let e = plan_workflow(&[step("a", &["b"]), step("b", &["c"]), step("c", &["b"])]);
        let e = e.unwrap_err();
        assert!(matches!(&e, InvalidWorkflow::Cycle { .. }), "{e:?}");
        let m = e.to_string();
        assert!(m.contains("b -> c -> b") || m.contains("c -> b -> c"), "{m}");
        let e = plan_workflow(&[step("a", &["a"])]).unwrap_err();
        assert_eq!(e.to_string(), "step \"a\" is in a cycle: a -> a");
        assert_eq!(
            plan_workflow(&[step("a", &["nope"])]).unwrap_err(),
            InvalidWorkflow::UnknownStep { step: "a".into(), name: "nope".into() }
        );
        assert_eq!(
            plan_workflow(&[step("a", &[]), step("a", &[])]).unwrap_err(),
            InvalidWorkflow::DuplicateName { name: "a".into() }
        );
        assert_eq!(
            plan_workflow(&[step("a b", &[])]).unwrap_err(),
            InvalidWorkflow::BadName { index: 0 }
        );
        assert_eq!(plan_workflow(&[]).unwrap_err(), InvalidWorkflow::NoSteps);
    }
}

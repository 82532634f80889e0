//! Bulk actions on the task list: cancel, requeue or delete the selected tasks, or every task
//! the list's filter matches (in the states the action applies to), at most [`MAX_BULK`] per
//! click. Every one asks first: the form posts without `confirm`, the answer is a page naming
//! the action and the count, whose button posts it again with `confirm=1`.
//!
//! Each task goes through the same queue function the API uses (`cancel`, `requeue`), so the
//! same fences hold: a task that ended meanwhile is skipped and counted, never an error for the
//! rest; deleting takes only ended tasks (succeeded, cancelled, dead), never live ones.

use maud::html;
use warp::http::StatusCode;

use super::layout::{csrf_field, html_response, page, see_other};
use super::session::Session;
use super::tasks::encode;
use super::{query, Page, Pairs};
use crate::admin::error::ApiError;
use crate::admin::params::TaskQuery;
use crate::admin::AdminState;
use crate::queue::{self, Cancel, QueueError, TaskFilter, TaskId, TaskState};

/// Most tasks one bulk action touches.
pub const MAX_BULK: usize = 10_000;
/// Ids read per page while collecting what a filter matches.
const PAGE: i64 = 500;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Cancel,
    Requeue,
    Delete,
}

impl Action {
    fn verb(self) -> &'static str {
        match self {
            Action::Cancel => "Cancel",
            Action::Requeue => "Requeue",
            Action::Delete => "Delete",
        }
    }

    /// The states the action applies to.
    fn states(self) -> &'static [TaskState] {
        match self {
            Action::Cancel => {
                &[TaskState::Blocked, TaskState::Pending, TaskState::Running, TaskState::Retrying]
            }
            Action::Requeue => &[TaskState::Dead],
            Action::Delete => &[TaskState::Succeeded, TaskState::Cancelled, TaskState::Dead],
        }
    }
}

/// `POST /ui/tasks/bulk`: `action` (`cancel`, `requeue`, `delete`, or the same with
/// `-matching`), the selected `task` ids, the list's filter as `f_<name>` fields, `confirm`.
pub async fn bulk(state: AdminState, s: Session, form: Pairs) -> Page {
    let mut ids = Vec::new();
    let mut filter_pairs = Vec::new();
    let mut rest = Vec::new();
    for (k, v) in form {
        if k == "task" {
            let id = v.trim().parse::<TaskId>().map_err(|_| {
                ApiError::bad_request(
                    "invalid_parameter",
                    format!("`task` is not a task id: {v:?}"),
                )
            })?;
            ids.push(id);
        } else if let Some(name) = k.strip_prefix("f_") {
            filter_pairs.push((name.to_owned(), v));
        } else {
            rest.push((k, v));
        }
    }
    let mut q = query(rest)?;
    let action_raw = q.take("action").unwrap_or_default();
    let confirmed = q.take_bool("confirm")?.unwrap_or(false);
    q.finish()?;
    let (action, matching) = match action_raw.as_str() {
        "cancel" => (Action::Cancel, false),
        "requeue" => (Action::Requeue, false),
        "delete" => (Action::Delete, false),
        "cancel-matching" => (Action::Cancel, true),
        "requeue-matching" => (Action::Requeue, true),
        "delete-matching" => (Action::Delete, true),
        other => {
            return Err(ApiError::bad_request(
                "invalid_parameter",
                format!("unknown bulk action {other:?}"),
            ))
        }
    };
    let mut fq = query(filter_pairs.clone())?;
    let tenant = s.caller().read_scope(fq.take("tenant").as_deref())?;
    let TaskQuery { filter, given } = TaskQuery::take(&mut fq, tenant.clone())?;
    fq.finish()?;
    let mut keep: Vec<(&str, String)> = Vec::new();
    if let (true, Some(t)) = (s.is_operator(), &tenant) {
        keep.push(("tenant", t.clone()));
    }
    keep.extend(given);
    let back = format!("/ui/tasks?{}", encode(&keep));

    if !matching && ids.is_empty() {
        let mut pairs = keep.clone();
        pairs.push(("done", "Select tasks first (the boxes on the left).".to_owned()));
        return Ok(see_other(&format!("/ui/tasks?{}", encode(&pairs))));
    }
    if ids.len() > MAX_BULK {
        return Err(ApiError::bad_request(
            "invalid_parameter",
            format!("at most {MAX_BULK} tasks at once, got {}", ids.len()),
        ));
    }
    if matching {
        ids = matching_ids(&state, &filter, action).await?;
    }

    if !confirmed {
        let what = if matching {
            format!(
                "{} {} task{} matching this view{}",
                action.verb(),
                ids.len(),
                if ids.len() == 1 { "" } else { "s" },
                if ids.len() >= MAX_BULK { " (the first 10000; click again for more)" } else { "" },
            )
        } else {
            format!(
                "{} the {} selected task{}",
                action.verb(),
                ids.len(),
                if ids.len() == 1 { "" } else { "s" }
            )
        };
        let which = action.states().iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ");
        let body = html! {
            h1 { "Confirm" }
            div.confirm #confirm {
                p #confirm-what { strong { (what) "?" } }
                p.muted { "Only " (which) " tasks are touched; the others are skipped and counted."
                    @if action == Action::Delete { " Deleted tasks are gone for good." } }
                form.inline method="post" action="/ui/tasks/bulk" {
                    (csrf_field(&s))
                    input type="hidden" name="action" value=(action_raw);
                    input type="hidden" name="confirm" value="1";
                    @for (k, v) in &filter_pairs { input type="hidden" name={"f_" (k)} value=(v); }
                    @if !matching { @for id in &ids { input type="hidden" name="task" value=(id); } }
                    button #confirm-button class=[(action == Action::Delete).then_some("danger")] type="submit" { (action.verb()) " " (ids.len()) }
                }
                " "
                a #confirm-back href=(back) { "Back" }
            }
        };
        return Ok(html_response(StatusCode::OK, page(&s, "/ui/tasks", "Confirm", body)));
    }

    let done = apply(&state, &s, action, &ids).await?;
    tracing::info!(action = action.verb(), tasks = ids.len(), who = %s.label(), "{done} (dashboard)");
    let mut pairs = keep.clone();
    pairs.push(("done", done));
    Ok(see_other(&format!("/ui/tasks?{}", encode(&pairs))))
}

/// The ids of the tasks `filter` matches in the states `action` applies to, newest first, at
/// most [`MAX_BULK`].
async fn matching_ids(
    state: &AdminState,
    filter: &TaskFilter,
    action: Action,
) -> Result<Vec<TaskId>, ApiError> {
    let mut ids = Vec::new();
    for &st in action.states() {
        if filter.state.is_some_and(|want| want != st) {
            continue;
        }
        let mut page = TaskFilter { state: Some(st), before: None, limit: PAGE, ..filter.clone() };
        while ids.len() < MAX_BULK {
            let rows = queue::list_tasks(state.store(), &page).await?;
            let Some(last) = rows.last() else { break };
            page.before = Some(last.id);
            let full = rows.len() == usize::try_from(PAGE).unwrap_or(0);
            ids.extend(rows.iter().map(|r| r.id).take(MAX_BULK - ids.len()));
            if !full {
                break;
            }
        }
    }
    Ok(ids)
}

/// Applies `action` to `ids` and says what came of it.
async fn apply(
    state: &AdminState,
    s: &Session,
    action: Action,
    ids: &[TaskId],
) -> Result<String, ApiError> {
    let scope = s.caller().scope();
    let (mut done, mut asked, mut skipped, mut kept) = (0usize, 0usize, 0usize, 0usize);
    match action {
        Action::Cancel => {
            for &id in ids {
                match queue::cancel(state.store(), scope, id).await {
                    Ok(Cancel::Cancelled) => done += 1,
                    Ok(Cancel::Requested { .. }) => asked += 1,
                    Err(QueueError::NotCancellable { .. } | QueueError::TaskNotFound(_)) => {
                        skipped += 1
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            let mut text = format!("Cancelled {done}");
            if asked > 0 {
                text.push_str(&format!("; asked {asked} running to stop (they end cancelled)"));
            }
            if skipped > 0 {
                text.push_str(&format!("; {skipped} skipped (already ended)"));
            }
            Ok(text + ".")
        }
        Action::Requeue => {
            for &id in ids {
                match queue::requeue(state.store(), scope, id).await {
                    Ok(_) => done += 1,
                    Err(QueueError::DedupKeyTaken { .. }) => kept += 1,
                    Err(QueueError::TaskNotFound(_)) => skipped += 1,
                    Err(e) => return Err(e.into()),
                }
            }
            let mut text = format!("Requeued {done}");
            if kept > 0 {
                text.push_str(&format!("; {kept} stayed dead (their dedup key is in use)"));
            }
            if skipped > 0 {
                text.push_str(&format!("; {skipped} skipped (not dead)"));
            }
            Ok(text + ".")
        }
        Action::Delete => {
            let deleted = queue::delete_tasks(state.store(), scope, ids).await?;
            let skipped = ids.len() - deleted.len();
            let mut text = format!("Deleted {}", deleted.len());
            if skipped > 0 {
                text.push_str(&format!("; {skipped} skipped (live: cancel them first)"));
            }
            Ok(text + ".")
        }
    }
}

//! Client commands on workflows: `workflow create|show|list|cancel`.

use anyhow::Context;
use reqwest::Method;
use serde_json::Value;

use super::{print, tenant_query, Api, ClientArgs};

#[derive(Debug, clap::Subcommand)]
pub enum WorkflowCommand {
    /// Create a workflow from a JSON file (`-`: stdin) holding `{"steps": [{"name",
    /// "task_type", "payload"?, "after"?: [names], ...}]}` (docs/api.md, "Workflows").
    Create {
        file: String,
        /// (Operator) for this tenant instead of `default`.
        #[arg(long)]
        tenant: Option<String>,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Show a workflow: each step's state, attempts and result.
    Show {
        id: i64,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// List workflows, newest first, with their steps counted by state.
    List {
        /// (Operator) only this tenant.
        #[arg(long)]
        tenant: Option<String>,
        #[command(flatten)]
        client: ClientArgs,
    },
    /// Cancel every step that has not ended (running ones are stopped by their runners).
    Cancel {
        id: i64,
        #[command(flatten)]
        client: ClientArgs,
    },
}

pub async fn workflow(command: WorkflowCommand) -> anyhow::Result<()> {
    match command {
        WorkflowCommand::Create { file, tenant, client } => {
            let body: Value = if file == "-" {
                serde_json::from_reader(std::io::stdin().lock())
                    .context("reading the workflow from stdin")?
            } else {
                let text = std::fs::read_to_string(&file)
                    .with_context(|| format!("reading the workflow from {file}"))?;
                serde_json::from_str(&text).with_context(|| format!("{file} is not valid JSON"))?
            };
            let api = Api::new(client)?;
            let request = api
                .request(Method::POST, "/v1/workflows")
                .query(&tenant_query(&tenant))
                .json(&body);
            let w = api.send(request).await?;
            if !api.printed_json(&w) {
                println!("created workflow {}", w["id"]);
                let rows: Vec<Vec<String>> = steps(&w)
                    .iter()
                    .map(|s| vec![print::cell(&s["name"]), print::cell(&s["task"])])
                    .collect();
                print::table(&["STEP", "TASK"], &rows);
            }
        }
        WorkflowCommand::Show { id, client } => {
            let api = Api::new(client)?;
            let w = api.send(api.request(Method::GET, &format!("/v1/workflows/{id}"))).await?;
            if !api.printed_json(&w) {
                println!("workflow {}: {}", w["id"], print::cell(&w["state"]));
                for key in ["tenant", "created_at", "cancelled_at"] {
                    if let Some(v) = w.get(key).filter(|v| !v.is_null()) {
                        println!("  {key:<14}{}", print::cell(v));
                    }
                }
                let rows: Vec<Vec<String>> = steps(&w)
                    .iter()
                    .map(|s| {
                        let after: Vec<String> = s["after"]
                            .as_array()
                            .map(|a| a.iter().map(print::cell).collect())
                            .unwrap_or_default();
                        vec![
                            print::cell(&s["name"]),
                            print::cell(&s["task"]),
                            print::cell(&s["task_type"]),
                            print::cell(&s["state"]),
                            print::cell(&s["attempts"]),
                            after.join(","),
                            print::short(&print::cell(&s["result"]), 40),
                            print::short(&print::cell(&s["last_error"]), 60),
                        ]
                    })
                    .collect();
                print::table(
                    &["STEP", "TASK", "TASK_TYPE", "STATE", "ATTEMPTS", "AFTER", "RESULT", "ERROR"],
                    &rows,
                );
            }
        }
        WorkflowCommand::List { tenant, client } => {
            let api = Api::new(client)?;
            let request = api.request(Method::GET, "/v1/workflows").query(&tenant_query(&tenant));
            let list = api.send(request).await?;
            if !api.printed_json(&list) {
                let empty = Vec::new();
                let rows: Vec<Vec<String>> = list["workflows"]
                    .as_array()
                    .unwrap_or(&empty)
                    .iter()
                    .map(|w| {
                        let mut row = vec![print::cell(&w["id"]), print::cell(&w["tenant"])];
                        for key in ["steps", "live", "succeeded", "cancelled", "dead"] {
                            row.push(print::cell(&w[key]));
                        }
                        row.push(print::time(&w["created_at"]));
                        row
                    })
                    .collect();
                print::table(
                    &["ID", "TENANT", "STEPS", "LIVE", "SUCCEEDED", "CANCELLED", "DEAD", "CREATED"],
                    &rows,
                );
            }
        }
        WorkflowCommand::Cancel { id, client } => {
            let api = Api::new(client)?;
            let path = format!("/v1/workflows/{id}/cancel");
            let done = api.send(api.request(Method::POST, &path)).await?;
            if !api.printed_json(&done) {
                println!(
                    "workflow {id}: {} steps cancelled, {} running steps asked to stop",
                    done["cancelled"], done["cancel_requested"]
                );
            }
        }
    }
    Ok(())
}

fn steps(w: &Value) -> Vec<Value> {
    w["steps"].as_array().cloned().unwrap_or_default()
}

-- Classic installer deployments, installer templates and managed processes (docs/contract.md "Classic
-- installer deployments", "Processes"; docs/decisions/classic-deployments.md, docs/decisions/managed-processes.md).
-- Portable to CockroachDB: application-made ids, no sequences, triggers or advisory locks; site_id leads every key.

-- One fan-out of an installer to machines. status is derived from the targets by the deployment workflow
-- (workflows/classic-deployment.ts): pending | in_progress | completed | failed | partial | cancelled | uninstalled.
CREATE TABLE IF NOT EXISTS classic_deployments (
  site_id TEXT NOT NULL REFERENCES sites (site_id),
  deployment_id TEXT NOT NULL,
  name TEXT NOT NULL,
  installer_url TEXT NOT NULL,
  installer_name TEXT NOT NULL,
  silent_flags TEXT NOT NULL,
  verify_path TEXT,
  sha256 TEXT,
  close_processes JSONB NOT NULL DEFAULT '[]',
  suppress_projects JSONB NOT NULL DEFAULT '[]',
  parallel_install BOOLEAN NOT NULL DEFAULT false,
  timeout_seconds INT,                                 -- installer run time limit on the machine (null: agent default)
  template_id TEXT,                                    -- installer template the defaults came from, if any
  status TEXT NOT NULL DEFAULT 'pending',
  cancel_requested BOOLEAN NOT NULL DEFAULT false,     -- a cancel pulled pending targets (status cancelled once settled)
  uninstall_requested BOOLEAN NOT NULL DEFAULT false,  -- an uninstall was queued on every target
  workflow_id TEXT NOT NULL,
  created_by TEXT NOT NULL,
  created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
  updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
  completed_at TIMESTAMPTZ,
  deleted_at TIMESTAMPTZ,
  PRIMARY KEY (site_id, deployment_id)
);
CREATE INDEX IF NOT EXISTS classic_deployments_by_created ON classic_deployments (site_id, created_at, deployment_id);

-- Per machine state of a deployment. status: pending | closing_processes | downloading | installing |
-- completed | failed | cancelled | uninstalled. action: install | uninstall (what the current command does).
CREATE TABLE IF NOT EXISTS classic_deployment_targets (
  site_id TEXT NOT NULL,
  deployment_id TEXT NOT NULL,
  machine_id TEXT NOT NULL,
  position INT NOT NULL,                               -- order of the create body's machines (serial order)
  action TEXT NOT NULL DEFAULT 'install',
  status TEXT NOT NULL DEFAULT 'pending',
  progress DOUBLE PRECISION,
  error TEXT,
  attempts INT NOT NULL DEFAULT 0,
  command_id TEXT,                                     -- the command of the current attempt (null: not dispatched)
  dispatched_at TIMESTAMPTZ,
  deadline_at TIMESTAMPTZ,
  finished_at TIMESTAMPTZ,
  updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
  PRIMARY KEY (site_id, deployment_id, machine_id)
);
CREATE INDEX IF NOT EXISTS classic_targets_by_status ON classic_deployment_targets (site_id, deployment_id, status);

-- Installer templates: defaults for classic deployments (site-scoped; names unique per site).
CREATE TABLE IF NOT EXISTS installer_templates (
  site_id TEXT NOT NULL REFERENCES sites (site_id),
  template_id TEXT NOT NULL,
  name TEXT NOT NULL,
  installer_name TEXT NOT NULL,
  installer_url TEXT NOT NULL,
  silent_flags TEXT NOT NULL DEFAULT '',
  verify_path TEXT,
  close_processes JSONB NOT NULL DEFAULT '[]',
  timeout_seconds INT,
  created_by TEXT NOT NULL,
  created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
  updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
  PRIMARY KEY (site_id, template_id)
);
CREATE UNIQUE INDEX IF NOT EXISTS installer_templates_name ON installer_templates (site_id, name);

-- Managed processes (process config of a machine). A deleted process keeps its row (deleted_at) so a repeat
-- DELETE answers alreadyDeleted; live names are unique per machine through the partial unique index, which
-- is what makes concurrent creates race-safe (one insert wins, the other gets 409 duplicate_process_name).
CREATE TABLE IF NOT EXISTS managed_processes (
  site_id TEXT NOT NULL,
  machine_id TEXT NOT NULL,
  process_id TEXT NOT NULL,
  name TEXT NOT NULL,
  exe_path TEXT NOT NULL,
  file_path TEXT,
  cwd TEXT,
  priority TEXT NOT NULL DEFAULT 'normal',
  visibility TEXT NOT NULL DEFAULT 'visible',
  launch_mode TEXT NOT NULL DEFAULT 'off',
  time_delay INT NOT NULL DEFAULT 0,
  time_to_init INT NOT NULL DEFAULT 0,
  relaunch_attempts INT NOT NULL DEFAULT 3,
  schedules JSONB NOT NULL DEFAULT '[]',
  schedule_preset_id TEXT,
  created_by TEXT,
  created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
  updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
  deleted_at TIMESTAMPTZ,
  PRIMARY KEY (site_id, machine_id, process_id),
  FOREIGN KEY (site_id, machine_id) REFERENCES machines (site_id, machine_id)
);
CREATE UNIQUE INDEX IF NOT EXISTS managed_processes_live_name ON managed_processes (site_id, machine_id, name) WHERE deleted_at IS NULL;

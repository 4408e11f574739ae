/**
 * `roost users …`: the platform's users, for superadmins (routes in api/routes/users.ts, docs/decisions/users.md):
 *
 *   users list [--role r] [--member-of siteId] [--include-deleted] [--all]   GET /api/users
 *   users show <uid>                                   GET /api/users/{uid} (with the delete cascade's progress)
 *   users promote <uid> <admin|superadmin>             POST /api/users/{uid}/promote
 *   users demote <uid>                                 POST /api/users/{uid}/demote (409 last_superadmin: exit 3)
 *   users assign-sites <uid> <siteId…>                 POST /api/users/{uid}/assign-sites (400 unknown_site)
 *   users remove-sites <uid> <siteId…>                 POST /api/users/{uid}/remove-sites
 *   users delete <uid> [--successor uid] [--wait]      DELETE /api/users/{uid} (409 orphan_sites: exit 3)
 *
 * The key needs `user=*` (or the uid) read for the reads and admin for the mutations, and its owner must be
 * a superadmin. Every mutation sends one Idempotency-Key per invocation. `delete --wait` polls the user until
 * the cascade workflow has completed (progress lines on stderr).
 */
import { type Command } from 'commander';
import { ClientError, seg } from '../client';
import { commandContext, idList, positiveInt, table, UsageError, withJson } from '../context';
import { addPagingOptions, fetchList, morePagesHint, type PagingOptions } from '../listing';

const ROLES = ['member', 'admin', 'superadmin'];

/** The delete cascade's progress as GET /api/users/{uid} shows it. */
interface DeletionView {
  status: 'running' | 'completed';
  successorUid: string | null;
  keysRevoked: number | null;
  sessionsRevoked: number | null;
  commandsCancelled: number | null;
  sitesTransferred: string[] | null;
  workflowId: string;
  [extra: string]: unknown;
}

/** A user record (api/routes/users.ts UserView). */
interface UserView {
  uid: string;
  email: string;
  role: string;
  siteIds: string[];
  ownedSiteIds: string[];
  displayName: string | null;
  deleted: boolean;
  createdAt: string;
  deletion: DeletionView | null;
  [extra: string]: unknown;
}

function role(raw: string): string {
  if (!ROLES.includes(raw)) throw new UsageError(`role must be one of ${ROLES.join(', ')}, got "${raw}"`);
  return raw;
}

function siteIdsArg(raw: string[]): string[] {
  const ids = raw.flatMap(idList);
  if (ids.length === 0) throw new UsageError('give at least one site id');
  return ids;
}

function describeDeletion(d: DeletionView | null): string {
  if (!d) return '-';
  const step = (label: string, v: unknown) => `${label} ${v === null ? '…' : Array.isArray(v) ? v.length : String(v)}`;
  return `${d.status} (${[
    step('keys', d.keysRevoked),
    step('sessions', d.sessionsRevoked),
    step('commands', d.commandsCancelled),
    step('sites moved', d.sitesTransferred),
  ].join(', ')}; workflow ${d.workflowId})`;
}

/** Registers `roost users`. */
export function registerUsers(program: Command): void {
  const users = program.command('users').description('users, roles and site memberships (superadmins)');

  withJson(
    addPagingOptions(
      users
        .command('list')
        .description('users, oldest first')
        .option('--role <role>', 'only this role (member, admin, superadmin)', role)
        .option('--member-of <siteId>', 'only members or owners of this site')
        .option('--include-deleted', 'deleted users too'),
      'users',
    ),
  ).action(async (o: PagingOptions & { role?: string; memberOf?: string; includeDeleted?: boolean }, cmd: Command) => {
    const ctx = commandContext(cmd);
    const query = { role: o.role, siteId: o.memberOf, includeDeleted: o.includeDeleted ? 'true' : undefined };
    const page = await fetchList<UserView>(ctx.client(), '/api/users', 'users', query, o);
    ctx.emit({ users: page.items, next_page_token: page.next }, () => {
      if (page.items.length === 0) return void process.stdout.write('no users\n');
      process.stdout.write(
        table(
          ['UID', 'EMAIL', 'ROLE', 'SITES', 'OWNS', 'STATE'],
          page.items.map((u) => [u.uid, u.email, u.role, u.siteIds.length, u.ownedSiteIds.length, u.deleted ? 'deleted' : 'active']),
        ) + '\n',
      );
      process.stdout.write(morePagesHint(page.next));
    });
  });

  withJson(users.command('show').description('one user (deleted ones too) with the delete cascade').argument('<uid>')).action(
    async (uid: string, _o: unknown, cmd: Command) => {
      const ctx = commandContext(cmd);
      const u = await ctx.client().get<UserView>(`/api/users/${seg(uid)}`);
      ctx.emit(u, () =>
        process.stdout.write(
          [
            `${u.uid} ${u.email}${u.displayName ? ` (${u.displayName})` : ''}`,
            `  role      ${u.role}${u.deleted ? ', deleted' : ''}`,
            `  sites     ${u.siteIds.join(', ') || '-'}`,
            `  owns      ${u.ownedSiteIds.join(', ') || '-'}`,
            `  created   ${u.createdAt}`,
            `  deletion  ${describeDeletion(u.deletion)}`,
          ].join('\n') + '\n',
        ),
      );
    },
  );

  withJson(
    users
      .command('promote')
      .description('raise the role (never lowers; a no-op says unchanged)')
      .argument('<uid>')
      .argument('<role>', 'admin or superadmin'),
  ).action(async (uid: string, to: string, _o: unknown, cmd: Command) => {
    const ctx = commandContext(cmd);
    if (to !== 'admin' && to !== 'superadmin') throw new UsageError(`promote to admin or superadmin, got "${to}"`);
    const r = await ctx
      .client()
      .post<{ previousRole: string; role: string; changed: boolean }>(
        `/api/users/${seg(uid)}/promote`,
        { role: to },
        { idempotencyKey: true },
      );
    ctx.emit(r, () => process.stdout.write(r.changed ? `${uid}: ${r.previousRole} → ${r.role}\n` : `${uid}: already ${r.role}\n`));
  });

  withJson(users.command('demote').description('lower the role to member (refused below the superadmin floor)').argument('<uid>')).action(
    async (uid: string, _o: unknown, cmd: Command) => {
      const ctx = commandContext(cmd);
      const r = await ctx
        .client()
        .post<{ previousRole: string; role: string; changed: boolean }>(`/api/users/${seg(uid)}/demote`, undefined, {
          idempotencyKey: true,
        });
      ctx.emit(r, () => process.stdout.write(r.changed ? `${uid}: ${r.previousRole} → ${r.role}\n` : `${uid}: already ${r.role}\n`));
    },
  );

  withJson(
    users
      .command('assign-sites')
      .description('add site memberships (all or nothing: unknown ids refuse the whole call)')
      .argument('<uid>')
      .argument('<siteIds...>', 'site ids (space or comma separated)'),
  ).action(async (uid: string, ids: string[], _o: unknown, cmd: Command) => {
    const ctx = commandContext(cmd);
    const r = await ctx
      .client()
      .post<{ siteIds: string[]; addedSiteIds: string[] }>(
        `/api/users/${seg(uid)}/assign-sites`,
        { siteIds: siteIdsArg(ids) },
        { idempotencyKey: true },
      );
    ctx.emit(r, () =>
      process.stdout.write(`${uid}: added ${r.addedSiteIds.join(', ') || 'nothing'}; member of ${r.siteIds.join(', ') || '-'}\n`),
    );
  });

  withJson(
    users
      .command('remove-sites')
      .description("end site memberships; the user's pending commands there are cancelled")
      .argument('<uid>')
      .argument('<siteIds...>', 'site ids (space or comma separated)'),
  ).action(async (uid: string, ids: string[], _o: unknown, cmd: Command) => {
    const ctx = commandContext(cmd);
    const r = await ctx
      .client()
      .post<{ removedSiteIds: string[]; cancelledCommandCount: number }>(
        `/api/users/${seg(uid)}/remove-sites`,
        { siteIds: siteIdsArg(ids) },
        { idempotencyKey: true },
      );
    ctx.emit(r, () =>
      process.stdout.write(
        `${uid}: removed from ${r.removedSiteIds.join(', ') || 'nothing'}; ${r.cancelledCommandCount} pending command(s) cancelled\n`,
      ),
    );
  });

  withJson(
    users
      .command('delete')
      .description('soft-delete a user: revoke keys and sessions, cancel pending commands, move owned sites to the successor')
      .argument('<uid>')
      .option('--successor <uid>', 'who takes over the sites this user owns (required when there are any)')
      .option('--wait', 'wait until the cascade has completed')
      .option('--timeout <seconds>', 'how long --wait waits (default 120)', positiveInt('--timeout'), 120),
  ).action(async (uid: string, o: { successor?: string; wait?: boolean; timeout: number }, cmd: Command) => {
    const ctx = commandContext(cmd);
    const client = ctx.client();
    const r = await client.delete<{ alreadyDeleted: boolean; deletion: DeletionView | null; workflowUrl: string | null }>(
      `/api/users/${seg(uid)}`,
      { query: { successorUid: o.successor }, idempotencyKey: true },
    );
    let result: Record<string, unknown> = r;
    if (o.wait) {
      const deadline = Date.now() + o.timeout * 1000;
      let last = '';
      for (;;) {
        const u = await client.get<UserView>(`/api/users/${seg(uid)}`);
        const now = describeDeletion(u.deletion);
        if (now !== last) ctx.info(`cascade: ${(last = now)}`);
        if (!u.deletion || u.deletion.status === 'completed') {
          result = { ...r, deletion: u.deletion };
          break;
        }
        if (Date.now() >= deadline)
          throw new ClientError({
            code: 'timeout',
            status: 0,
            detail: `the delete cascade of ${uid} is still running after ${o.timeout} s`,
            body: { deletion: u.deletion },
            method: 'GET',
            url: `/api/users/${uid}`,
            attempts: 1,
          });
        await new Promise((resolve) => setTimeout(resolve, 500));
      }
    }
    ctx.emit(result, () => {
      process.stdout.write(r.alreadyDeleted ? `${uid} was already deleted\n` : `deleted ${uid}\n`);
      process.stdout.write(`  cascade  ${describeDeletion(result.deletion as DeletionView | null)}\n`);
      if (r.workflowUrl) process.stdout.write(`  workflow ${r.workflowUrl}\n`);
    });
  });
}

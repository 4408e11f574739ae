/**
 * Signed manifests (docs/decisions/signed-manifests.md): the per-site Ed25519 key (created once
 * under concurrency, sealed at rest), the public key routes, signatures on publish and on first read of
 * older versions, verification with node:crypto against the served JWK, and a real agent refusing a
 * tampered signature or another site's signature while its tree stays untouched.
 */
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { createPublicKey, randomBytes, verify } from 'node:crypto';
import { createHarness, type Harness } from '../support/harness';
import { scopedKey } from './rollout-fixtures';
import { insertKey } from '../support/identity';
import { newId, sha256Hex } from '../../domain/hex';
import { openSealed } from '../../domain/seal';
import { canonicalJson, CHUNK_SIZE, computeVersionId, summarize, type VersionBody, VERSION_MEDIA_TYPE } from '../../domain/version';
import { chunkBlobName, versionBlobName } from '../../storage/blob';
import { activeSigningKey, sealKeyOf } from '../../services/signing';
import { signVersion, versionSigningMessage, verifyVersionSignature } from '../../domain/signature';
import { Agent, SIGNATURE_INVALID } from '../../agent/agent';
import { verifyTree } from '../../agent/fleet';

let h: Harness;
let baseUrl: string;
let secret: string;
let tmpRoot: string;

beforeAll(async () => {
  h = await createHarness();
  baseUrl = await h.listen();
  secret = await h.enrolmentSecret();
  tmpRoot = await fs.mkdtemp(path.join(os.tmpdir(), 'roost-signing-test-'));
});
afterAll(async () => {
  await h.close();
  await fs.rm(tmpRoot, { recursive: true, force: true });
});

/** Version body of `files` (path → bytes), its chunks put in blob storage of `siteId`. */
async function bodyOf(files: Record<string, Buffer>, siteId = h.siteId): Promise<VersionBody> {
  const entries: VersionBody['files'] = [];
  for (const [p, data] of Object.entries(files)) {
    const chunks = [];
    for (let off = 0; off < data.length; off += CHUNK_SIZE) {
      const part = Buffer.from(data.subarray(off, Math.min(data.length, off + CHUNK_SIZE)));
      chunks.push({ hash: sha256Hex(part), size: part.length });
      await h.deps.blob.put('chunks', chunkBlobName(siteId, sha256Hex(part)), part, 'application/octet-stream');
    }
    entries.push({ path: p, size: data.length, chunks });
  }
  return { schemaVersion: 2, mediaType: VERSION_MEDIA_TYPE, config: { producer: 'signing.test' }, files: entries };
}

async function createRoost(name: string, extractPath = 'signed-app'): Promise<string> {
  const res = await h.request({ method: 'POST', url: '/api/roosts', body: { siteId: h.siteId, name, extractPath } });
  expect(res.statusCode).toBe(201);
  return res.json().roostId;
}

/** Publishes through the API (so the version is signed at publish). */
async function publish(roostId: string, files: Record<string, Buffer>): Promise<string> {
  const version = await bodyOf(files);
  const res = await h.request({
    method: 'POST',
    url: `/api/roosts/${roostId}/versions`,
    idempotencyKey: true,
    body: { siteId: h.siteId, version },
  });
  expect(res.statusCode).toBe(201);
  return res.json().versionId;
}

/** Inserts a version the way publish stored it before signing existed (no signature). */
async function insertUnsignedVersion(roostId: string, files: Record<string, Buffer>): Promise<string> {
  const body = await bodyOf(files);
  const versionId = computeVersionId(body);
  const blobName = versionBlobName(h.siteId, roostId, versionId);
  await h.deps.blob.put('versions', blobName, Buffer.from(canonicalJson(body)), 'application/json');
  const { totalSize, totalFiles } = summarize(body);
  const { rows } = await h.deps.db.query<{ version_counter: number }>(
    'UPDATE roosts SET version_counter = version_counter + 1, current_version_id = $3 WHERE site_id = $1 AND roost_id = $2 RETURNING version_counter',
    [h.siteId, roostId, versionId],
  );
  await h.deps.db.query(
    `INSERT INTO roost_versions (site_id, roost_id, version_id, version_number, blob_name, total_size, total_files, created_by)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`,
    [h.siteId, roostId, versionId, rows[0].version_counter, blobName, totalSize, totalFiles, h.userId],
  );
  return versionId;
}

async function versionRow(roostId: string, versionId: string) {
  const { rows } = await h.deps.db.query(
    'SELECT signature, signing_key_id FROM roost_versions WHERE site_id = $1 AND roost_id = $2 AND version_id = $3',
    [h.siteId, roostId, versionId],
  );
  return rows[0];
}

function keySet(siteId = h.siteId, key?: string | null) {
  return h.request({ method: 'GET', url: `/api/sites/${siteId}/signing-keys`, key });
}

/** node:crypto verification against a served JWK, independent of domain/signature.ts. */
function verifiesWith(jwk: { x: string }, message: string, signature: string): boolean {
  const key = createPublicKey({ key: { kty: 'OKP', crv: 'Ed25519', x: jwk.x }, format: 'jwk' });
  return verify(null, Buffer.from(message, 'utf8'), key, Buffer.from(signature, 'base64url'));
}

async function writeTree(dir: string, files: Record<string, Buffer>): Promise<void> {
  for (const [p, data] of Object.entries(files)) {
    await fs.mkdir(path.dirname(path.join(dir, p)), { recursive: true });
    await fs.writeFile(path.join(dir, p), data);
  }
}

// ---------------------------------------------------------------------------------------------------

describe('site signing key', () => {
  it('is created once per site under concurrency, private key sealed and bound to its site', async () => {
    const other = await h.other();
    const sealKey = sealKeyOf(h.deps.cfg);
    const keys = await Promise.all(Array.from({ length: 8 }, () => activeSigningKey(h.deps.db, sealKey, other.siteId)));
    expect(new Set(keys.map((k) => k.keyId)).size).toBe(1);
    const { rows } = await h.deps.db.query(
      'SELECT key_id, public_key, private_key_sealed, active FROM site_signing_keys WHERE site_id = $1',
      [other.siteId],
    );
    expect(rows).toHaveLength(1);
    expect(rows[0]).toMatchObject({ key_id: keys[0].keyId, public_key: keys[0].publicKey, active: true });
    expect(rows[0].key_id).toMatch(/^sk_[0-9a-f]{24}$/);
    // Sealed at rest: opens only with its own aad.
    expect(rows[0].private_key_sealed).toMatch(/^v1\./);
    expect(openSealed(sealKey, rows[0].private_key_sealed, `signing-key:${other.siteId}:${rows[0].key_id}`).length).toBeGreaterThan(32);
    expect(() => openSealed(sealKey, rows[0].private_key_sealed, `signing-key:${h.siteId}:${rows[0].key_id}`)).toThrow();
  });

  it('is never served when its sealed private key does not match (a row written with the database alone)', async () => {
    const other = await h.other();
    const sealKey = sealKeyOf(h.deps.cfg);
    const real = await activeSigningKey(h.deps.db, sealKey, other.siteId);
    // A forged inactive key whose "sealed" private key is the real one copied under another kid.
    const forgedX = randomBytes(32).toString('base64url');
    const { rows } = await h.deps.db.query('SELECT private_key_sealed FROM site_signing_keys WHERE site_id = $1', [other.siteId]);
    await h.deps.db.query(
      `INSERT INTO site_signing_keys (site_id, key_id, public_key, private_key_sealed, active) VALUES ($1, $2, $3, $4, false)`,
      [other.siteId, `sk_${'0'.repeat(24)}`, forgedX, rows[0].private_key_sealed],
    );
    const res = await keySet(other.siteId, other.apiKey);
    expect(res.statusCode).toBe(200);
    expect(res.json().keys.map((k: { kid: string }) => k.kid)).toEqual([real.keyId]);
  });
});

describe('GET /api/sites/{siteId}/signing-keys', () => {
  it('serves the JWK set (creating the key on first use) and the agent route serves the same set', async () => {
    const res = await keySet();
    expect(res.statusCode).toBe(200);
    const body = res.json();
    expect(body.siteId).toBe(h.siteId);
    expect(body.signatureMessage).toBe('roost-version-v1:<siteId>:<roostId>:<versionId>');
    expect(body.keys).toHaveLength(1);
    expect(body.keys[0]).toMatchObject({ kty: 'OKP', crv: 'Ed25519', alg: 'EdDSA', use: 'sig', active: true });
    expect(body.keys[0].x).toMatch(/^[A-Za-z0-9_-]{43}$/);
    expect(body.keys[0].kid).toBe(`sk_${sha256Hex(Buffer.from(body.keys[0].x, 'base64url')).slice(0, 24)}`);
    expect((await keySet()).json()).toEqual(body);

    const enrol = await h.request({
      method: 'POST',
      url: '/api/agent/enrol',
      key: null,
      body: { siteId: h.siteId, enrolmentSecret: secret, machineId: 'keys-agent', hostname: 'k', agentVersion: '1' },
    });
    expect(enrol.statusCode).toBe(201);
    const { agentToken, signingKeys } = enrol.json();
    expect(signingKeys).toEqual(body.keys);
    const agentRes = await h.request({ method: 'GET', url: '/api/agent/signing-keys', key: agentToken });
    expect(agentRes.statusCode).toBe(200);
    expect(agentRes.json()).toEqual(body);
    // A user key is not an agent token.
    expect((await h.request({ method: 'GET', url: '/api/agent/signing-keys' })).statusCode).toBe(401);
  });

  it('needs site read (403 with required), hides other sites (404), rejects bad ids (400) and anonymous calls (401)', async () => {
    const key = await scopedKey(h, [{ resource: 'roost', id: '*', permissions: ['read'] }]);
    const denied = await keySet(h.siteId, key);
    expect(denied.statusCode).toBe(403);
    expect(denied.json()).toMatchObject({ code: 'scope_insufficient', required: { resource: 'site', id: h.siteId, permission: 'read' } });
    // A refused call creates no key for a site that has none yet.
    const other = await h.other();
    const { raw: otherScoped } = await insertKey(h.deps.db, {
      uid: other.userId,
      scopes: [{ resource: 'roost', id: '*', permissions: ['read'] }],
    });
    expect((await keySet(other.siteId, otherScoped)).statusCode).toBe(403);
    const hidden = await keySet(h.siteId, other.apiKey);
    expect(hidden.statusCode).toBe(404);
    expect(hidden.json().code).toBe('not_found');
    const bad = await h.request({ method: 'GET', url: '/api/sites/bad%20site!/signing-keys' });
    expect(bad.statusCode).toBe(400);
    expect(bad.json().code).toBe('validation_failed');
    expect((await keySet(h.siteId, null)).statusCode).toBe(401);
    // Nothing was created for the site that was refused.
    const { rows } = await h.deps.db.query('SELECT count(*)::INT AS n FROM site_signing_keys WHERE site_id = $1', [other.siteId]);
    expect(rows[0].n).toBe(0);
  });
});

describe('version signatures', () => {
  it('signs at publish; the record and the agent route carry a signature that verifies against the served JWK', async () => {
    const roostId = await createRoost('signed-at-publish');
    const versionId = await publish(roostId, { 'a.txt': Buffer.from('alpha') });
    const stored = await versionRow(roostId, versionId);
    expect(stored.signature).toMatch(/^[A-Za-z0-9_-]{86}$/);
    const [jwk] = (await keySet()).json().keys;
    expect(stored.signing_key_id).toBe(jwk.kid);

    const fetched = (await h.request({ method: 'GET', url: `/api/roosts/${roostId}/versions/${versionId}?siteId=${h.siteId}` })).json();
    expect(fetched).toMatchObject({
      signature: stored.signature,
      signingKeyId: jwk.kid,
      metadata: { signature: stored.signature, signingKeyId: jwk.kid },
    });
    const message = `roost-version-v1:${h.siteId}:${roostId}:${versionId}`;
    expect(versionSigningMessage(h.siteId, roostId, versionId).toString('utf8')).toBe(message);
    expect(verifiesWith(jwk, message, fetched.signature)).toBe(true);
    // Bound to site, roost and version: the same signature does not verify for anything else.
    expect(verifiesWith(jwk, `roost-version-v1:${h.siteId}:other-roost:${versionId}`, fetched.signature)).toBe(false);
    expect(verifyVersionSignature(jwk, h.siteId, roostId, 'f'.repeat(64), fetched.signature)).toBe(false);

    const list = (await h.request({ method: 'GET', url: `/api/roosts/${roostId}/versions?siteId=${h.siteId}` })).json();
    expect(list.versions[0]).toMatchObject({ versionId, signature: stored.signature, signingKeyId: jwk.kid });

    const enrol = await h.request({
      method: 'POST',
      url: '/api/agent/enrol',
      key: null,
      body: { siteId: h.siteId, enrolmentSecret: secret, machineId: 'sig-reader', hostname: 's', agentVersion: '1' },
    });
    const agentView = (
      await h.request({ method: 'GET', url: `/api/agent/roosts/${roostId}/versions/${versionId}`, key: enrol.json().agentToken })
    ).json();
    expect(agentView).toMatchObject({ signature: stored.signature, signingKeyId: jwk.kid });
  });

  it('signs versions published before signing existed on first read, once', async () => {
    const roostId = await createRoost('signed-on-read');
    const versionId = await insertUnsignedVersion(roostId, { 'old.txt': Buffer.from('published long ago') });
    expect(await versionRow(roostId, versionId)).toEqual({ signature: null, signing_key_id: null });
    const first = (await h.request({ method: 'GET', url: `/api/roosts/${roostId}/versions?siteId=${h.siteId}` })).json().versions[0];
    const stored = await versionRow(roostId, versionId);
    expect(stored.signature).toBe(first.signature);
    expect(stored.signing_key_id).toBe(first.signingKeyId);
    const [jwk] = (await keySet()).json().keys;
    expect(verifiesWith(jwk, `roost-version-v1:${h.siteId}:${roostId}:${versionId}`, first.signature)).toBe(true);
    const againRes = await h.request({ method: 'GET', url: `/api/roosts/${roostId}/versions/current?siteId=${h.siteId}` });
    expect(againRes.statusCode).toBe(200);
    const again = againRes.json();
    expect(again.signature).toBe(first.signature);
    expect(await versionRow(roostId, versionId)).toEqual(stored);
  });
});

describe('reference agent verifies before it switches', () => {
  let agent: Agent;
  const v1Files = { 'app.exe': randomBytes(40_000), 'conf/settings.json': Buffer.from('{"v":1}') };
  const src = () => path.join(tmpRoot, 'src-v1');
  const live = () => path.join(tmpRoot, 'machine', 'signed-app');

  async function sync(roostId: string, versionId: string, extractRoot = 'signed-app') {
    const commandId = newId('cmd');
    await h.deps.db.query(
      `INSERT INTO commands (site_id, machine_id, command_id, type, status, params, expires_at)
       VALUES ($1, $2, $3, 'sync_pull', 'pending', $4, now() + INTERVAL '10 minutes')`,
      [h.siteId, agent.machineId, commandId, JSON.stringify({ roostId, versionId, extractRoot })],
    );
    const outcome = await agent.waitForCommand(commandId);
    const { rows: cmd } = await h.deps.db.query(
      'SELECT status, error FROM commands WHERE site_id = $1 AND machine_id = $2 AND command_id = $3',
      [h.siteId, agent.machineId, commandId],
    );
    const { rows: ts } = await h.deps.db.query(
      'SELECT reported_version_id, status, error FROM roost_target_states WHERE site_id = $1 AND machine_id = $2 AND roost_id = $3',
      [h.siteId, agent.machineId, roostId],
    );
    return { outcome, command: cmd[0], state: ts[0] };
  }

  beforeAll(async () => {
    await writeTree(src(), v1Files);
    agent = new Agent({
      baseUrl,
      siteId: h.siteId,
      enrolmentSecret: secret,
      machineId: 'verifier',
      rootDir: path.join(tmpRoot, 'machine'),
      heartbeatMs: 0,
      pollWaitSeconds: 2,
    });
    await agent.start();
  });
  afterAll(async () => agent?.stop());

  it('pins the site key at enrolment and keeps it with its token', async () => {
    const served = (await keySet()).json().keys.map((k: { kid: string; x: string }) => ({ kid: k.kid, x: k.x }));
    expect(agent.pinnedKeys.map((k) => ({ kid: k.kid, x: k.x }))).toEqual(served);
    const saved = JSON.parse(await fs.readFile(path.join(tmpRoot, 'machine', 'state', 'agent.json'), 'utf8'));
    expect(saved.signingKeys.map((k: { kid: string }) => k.kid)).toEqual(served.map((k: { kid: string }) => k.kid));
  });

  it('refuses a tampered signature and a version signed by another site; the tree stays as it was', async () => {
    const roostId = await createRoost('verified');
    const v1 = await publish(roostId, v1Files);
    const ok = await sync(roostId, v1);
    expect(ok.outcome.status).toBe('completed');
    expect(await verifyTree(src(), live())).toEqual([]);

    // v2: its signature in the database replaced by v1's (valid bytes, wrong message).
    const v2 = await publish(roostId, { ...v1Files, 'app.exe': randomBytes(40_000), 'new.txt': Buffer.from('new') });
    const v1Sig = (await versionRow(roostId, v1)).signature;
    await h.deps.db.query('UPDATE roost_versions SET signature = $4 WHERE site_id = $1 AND roost_id = $2 AND version_id = $3', [
      h.siteId,
      roostId,
      v2,
      v1Sig,
    ]);
    const tampered = await sync(roostId, v2);
    expect(tampered.outcome).toMatchObject({ status: 'failed', error: SIGNATURE_INVALID });
    expect(tampered.command).toEqual({ status: 'failed', error: SIGNATURE_INVALID });
    expect(tampered.state).toEqual({ reported_version_id: v2, status: 'failed', error: SIGNATURE_INVALID });
    expect(tampered.outcome.counters).toMatchObject({ chunks_fetched: 0, files_assembled: 0 });
    expect(await verifyTree(src(), live())).toEqual([]);
    expect((await agent.readManifest(roostId))?.versionId).toBe(v1);

    // v3: a valid signature by another site's key (the agent refreshes its keys, still does not know it).
    const other = await h.other();
    const otherKey = await activeSigningKey(h.deps.db, sealKeyOf(h.deps.cfg), other.siteId);
    const v3 = await publish(roostId, { 'only.txt': Buffer.from('v3') });
    await h.deps.db.query(
      'UPDATE roost_versions SET signature = $4, signing_key_id = $5 WHERE site_id = $1 AND roost_id = $2 AND version_id = $3',
      [h.siteId, roostId, v3, signVersion(otherKey.privateKey, h.siteId, roostId, v3), otherKey.keyId],
    );
    const foreign = await sync(roostId, v3);
    expect(foreign.command).toEqual({ status: 'failed', error: SIGNATURE_INVALID });
    expect(foreign.state).toMatchObject({ reported_version_id: v3, status: 'failed', error: SIGNATURE_INVALID });
    expect(agent.pinnedKeys.map((k) => k.kid)).not.toContain(otherKey.keyId);
    expect(await verifyTree(src(), live())).toEqual([]);

    // Restoring the real signature: the same agent now takes v2.
    const { rows } = await h.deps.db.query(
      'SELECT signing_key_id FROM roost_versions WHERE site_id = $1 AND roost_id = $2 AND version_id = $3',
      [h.siteId, roostId, v2],
    );
    const key = await activeSigningKey(h.deps.db, sealKeyOf(h.deps.cfg), h.siteId);
    expect(rows[0].signing_key_id).toBe(key.keyId);
    await h.deps.db.query('UPDATE roost_versions SET signature = $4 WHERE site_id = $1 AND roost_id = $2 AND version_id = $3', [
      h.siteId,
      roostId,
      v2,
      signVersion(key.privateKey, h.siteId, roostId, v2),
    ]);
    const fine = await sync(roostId, v2);
    expect(fine.command).toEqual({ status: 'completed', error: null });
    expect(fine.state).toEqual({ reported_version_id: v2, status: 'committed', error: null });
  });

  it('re-hashes chunks of its local store before reusing them (a corrupted one is fetched again)', async () => {
    const roostId = await createRoost('rehash', 'rehash-app');
    const data = randomBytes(20_000);
    const a = await publish(roostId, { 'a.bin': data });
    expect((await sync(roostId, a, 'rehash-app')).outcome.counters).toMatchObject({ chunks_fetched: 1, chunks_dedup: 0 });
    const stored = path.join(tmpRoot, 'machine', 'chunks', sha256Hex(data));
    const bad = Buffer.from(data);
    bad[7] ^= 0xff;
    await fs.writeFile(stored, bad);
    const b = await publish(roostId, { 'a.bin': data, 'copy/b.bin': data });
    const res = await sync(roostId, b, 'rehash-app');
    expect(res.outcome).toMatchObject({
      status: 'completed',
      counters: { chunks_total: 1, chunks_dedup: 0, chunks_fetched: 1, files_skipped: 1, files_assembled: 1 },
    });
    expect(await fs.readFile(path.join(tmpRoot, 'machine', 'rehash-app', 'copy', 'b.bin'))).toEqual(data);
  });
});

// An independent client of ckpt-auditd (README.md beside this file): starts the real daemon on
// loopback with TLS and a token file, then checks health, reflection, token authentication and
// roles, StartAudit on the fixture, the WatchJob stream to completion, Gate, QueryAudits, and
// NOT_SERVING on SIGTERM. Binaries and fixtures come from the environment (set by ctest).
'use strict';

const { test, before, after } = require('node:test');
const assert = require('node:assert/strict');
const { spawn, execFileSync } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');

const AUDITD = process.env.CKPT_AUDITD;
const CLI = process.env.CKPT_AUDIT_CLI;
const DATA = process.env.CKPT_TEST_DATA;
const PROTO_ROOT = process.env.CKPT_PROTO_ROOT;
for (const [name, value] of Object.entries({ AUDITD, CLI, DATA, PROTO_ROOT })) {
  if (!value) throw new Error(`environment variable for ${name} is not set (run through ctest)`);
}

const LOAD_OPTIONS = { keepCase: true, longs: Number, enums: String, defaults: true };
const audit = grpc.loadPackageDefinition(
  protoLoader.loadSync('ckpt_audit/v1/audit.proto', { ...LOAD_OPTIONS, includeDirs: [PROTO_ROOT] }),
).ckpt_audit.v1;
const protos = path.join(__dirname, 'protos');
const health = grpc.loadPackageDefinition(
  protoLoader.loadSync('health.proto', { ...LOAD_OPTIONS, includeDirs: [protos] }),
).grpc.health.v1;
const reflection = grpc.loadPackageDefinition(
  protoLoader.loadSync('reflection.proto', { ...LOAD_OPTIONS, includeDirs: [protos] }),
).grpc.reflection.v1alpha;

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'ckpt-node-'));
const models = path.join(dir, 'models');
const root = path.join(models, 'mini-kimi-mxfp4');
const tokens = {};
let daemon;
let daemonLog = '';
let address;
let creds;

function run(cmd, args) {
  return execFileSync(cmd, args, { cwd: dir, encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
}

function makePki() {
  const ec = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:P-256', '-nodes'];
  const p = (f) => path.join(dir, f);
  fs.writeFileSync(p('server.ext'), 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' +
    'basicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n');
  run('openssl', ['req', '-x509', ...ec, '-keyout', p('ca.key'), '-out', p('ca.pem'), '-days', '2',
    '-subj', '/CN=node-test-ca', '-addext', 'basicConstraints=critical,CA:TRUE',
    '-addext', 'keyUsage=critical,keyCertSign,cRLSign']);
  run('openssl', ['req', ...ec, '-keyout', p('server.key'), '-out', p('server.csr'),
    '-subj', '/CN=localhost']);
  run('openssl', ['x509', '-req', '-in', p('server.csr'), '-CA', p('ca.pem'), '-CAkey', p('ca.key'),
    '-CAcreateserial', '-days', '2', '-extfile', p('server.ext'), '-out', p('server.pem')]);
  fs.chmodSync(p('server.key'), 0o600);
}

function withToken(role) {
  const md = new grpc.Metadata();
  if (role) md.set('authorization', `Bearer ${tokens[role]}`);
  return md;
}

function unary(client, method, request, md = new grpc.Metadata()) {
  return new Promise((resolve, reject) => {
    client[method](request, md, { deadline: Date.now() + 60_000 }, (err, res) => {
      if (err) reject(err);
      else resolve(res);
    });
  });
}

before(async () => {
  fs.mkdirSync(models);
  fs.cpSync(path.join(DATA, 'mini-kimi-mxfp4'), root, { recursive: true });
  run(CLI, ['keys', 'generate', '--out', path.join(dir, 'key.pem')]);
  for (const role of ['reader', 'auditor', 'gate', 'admin']) {
    const out = run(CLI, ['tokens', 'add', '--file', path.join(dir, 'tokens'), '--role', role,
      '--name', `node-${role}`]);
    tokens[role] = out.split('\n')[0];
  }
  makePki();
  daemon = spawn(AUDITD, ['--listen', '127.0.0.1:0', '--tls-cert', path.join(dir, 'server.pem'),
    '--tls-key', path.join(dir, 'server.key'), '--tokens', path.join(dir, 'tokens'),
    '--db', path.join(dir, 'ev.db'), '--key', path.join(dir, 'key.pem'), '--allow-root', models,
    '--drain-seconds', '3'], { stdio: ['ignore', 'ignore', 'pipe'] });
  const port = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`daemon did not start:\n${daemonLog}`)), 20_000);
    daemon.stderr.on('data', (chunk) => {
      daemonLog += chunk;
      const m = /serving on port (\d+)/.exec(daemonLog);
      if (m) {
        clearTimeout(timer);
        resolve(Number(m[1]));
      }
    });
    daemon.on('exit', (code) => reject(new Error(`daemon exited ${code}:\n${daemonLog}`)));
  });
  address = `127.0.0.1:${port}`;
  creds = grpc.credentials.createSsl(fs.readFileSync(path.join(dir, 'ca.pem')));
});

after(() => {
  if (daemon && daemon.exitCode === null) daemon.kill('SIGKILL');
  fs.rmSync(dir, { recursive: true, force: true });
});

test('health answers SERVING without a token', async () => {
  const client = new health.Health(address, creds);
  const res = await unary(client, 'Check', { service: '' });
  assert.equal(res.status, 'SERVING');
  client.close();
});

test('reflection lists the audit service without a token', async () => {
  const client = new reflection.ServerReflection(address, creds);
  const call = client.ServerReflectionInfo();
  const names = await new Promise((resolve, reject) => {
    call.on('data', (res) => {
      if (res.error_response) reject(new Error(res.error_response.error_message));
      else resolve(res.list_services_response.service.map((s) => s.name));
      call.end();
    });
    call.on('error', reject);
    call.write({ list_services: '' });
  });
  assert.ok(names.includes('ckpt_audit.v1.AuditService'), names.join(','));
  assert.ok(names.includes('grpc.health.v1.Health'), names.join(','));
  client.close();
});

test('plaintext to the TLS port fails', async () => {
  const client = new audit.AuditService(address, grpc.credentials.createInsecure());
  await assert.rejects(unary(client, 'QueryAudits', {}, withToken('reader')),
    (e) => e.code === grpc.status.UNAVAILABLE);
  client.close();
});

test('no token or an unknown token is UNAUTHENTICATED; a missing role is PERMISSION_DENIED',
  async () => {
    const client = new audit.AuditService(address, creds);
    await assert.rejects(unary(client, 'QueryAudits', {}),
      (e) => e.code === grpc.status.UNAUTHENTICATED);
    const forged = new grpc.Metadata();
    forged.set('authorization', `Bearer ckpt_${'0'.repeat(64)}`);
    await assert.rejects(unary(client, 'QueryAudits', {}, forged),
      (e) => e.code === grpc.status.UNAUTHENTICATED);
    await assert.rejects(unary(client, 'StartAudit', { root }, withToken('gate')),
      (e) => e.code === grpc.status.PERMISSION_DENIED);
    await assert.rejects(unary(client, 'Gate', { root }, withToken('auditor')),
      (e) => e.code === grpc.status.PERMISSION_DENIED);
    await assert.rejects(unary(client, 'VerifyLog', {}, withToken('reader')),
      (e) => e.code === grpc.status.PERMISSION_DENIED);
    client.close();
  });

test('StartAudit, the WatchJob stream to completion, Gate and QueryAudits', async () => {
  const client = new audit.AuditService(address, creds);
  const job = await unary(client, 'StartAudit', { root }, withToken('auditor'));
  assert.match(job.id, /^job-/);
  const events = await new Promise((resolve, reject) => {
    const seen = [];
    const call = client.WatchJob({ id: job.id }, withToken('reader'));
    call.on('data', (e) => seen.push(e));
    call.on('error', reject);
    call.on('end', () => resolve(seen));
  });
  assert.ok(events.length >= 3, `only ${events.length} events`);
  assert.equal(events[0].phase, 'queued');
  const last = events[events.length - 1];
  assert.equal(last.done, true);
  assert.equal(last.job.state, 'JOB_STATE_SUCCEEDED', last.job.error_message);
  assert.equal(last.job.verdict, 'pass');
  assert.ok(last.job.record_id >= 0);
  // The origin fields of Job (a plain directory: its record states no layout and no refs).
  for (const field of ['layout', 'source_layout', 'model_ref', 'source_ref']) {
    assert.equal(last.job[field], '', field);
  }

  const gate = await unary(client, 'Gate', { root }, withToken('gate'));
  assert.equal(gate.pass, true, gate.reasons.join('; '));
  assert.equal(gate.record_id, last.job.record_id);
  assert.match(gate.manifest_root, /^[0-9a-f]{64}$/);

  const page = await unary(client, 'QueryAudits', { digest: gate.manifest_root },
    withToken('reader'));
  const ids = page.audits.map((a) => a.id).sort((a, b) => a - b);
  // The record, its in-toto test result (appended right after it) and the gate decision.
  assert.deepEqual(ids, [last.job.record_id, last.job.record_id + 1, gate.decision_id]);
  const gates = await unary(client, 'QueryAudits',
    { digest: gate.manifest_root, predicate_type: 'gate' }, withToken('reader'));
  assert.deepEqual(gates.audits.map((a) => a.id), [gate.decision_id]);
  // The signed record names who caused it.
  const rec = await unary(client, 'GetRecord', { id: last.job.record_id }, withToken('reader'));
  const envelope = JSON.parse(rec.envelope.toString('utf8'));
  const statement = JSON.parse(Buffer.from(envelope.payload, 'base64').toString('utf8'));
  assert.equal(statement.predicate.invoker, 'auditor:node-auditor');
  client.close();
});

test('SIGTERM: health turns NOT_SERVING, then the daemon exits 0', async () => {
  const client = new health.Health(address, creds);
  const statuses = [];
  const watched = new Promise((resolve) => {
    const call = client.Watch({ service: '' });
    call.on('data', (res) => {
      statuses.push(res.status);
      if (res.status === 'SERVING') daemon.kill('SIGTERM');
      if (res.status === 'NOT_SERVING') resolve();
    });
    call.on('error', () => resolve());
    call.on('end', () => resolve());
  });
  const exited = new Promise((resolve) => daemon.on('exit', (code) => resolve(code)));
  await watched;
  assert.deepEqual(statuses, ['SERVING', 'NOT_SERVING']);
  assert.equal(await exited, 0, daemonLog);
  client.close();
});

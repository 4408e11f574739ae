/**
 * The secret grep over the suite's logs (docs/observability.md "Secrets in the suite's logs"): finds raw
 * credentials in log text. Independent of the loggers' own redaction (domain/redaction.ts): a secret that
 * reached a file here got past it. Used by scripts/run-tests.ts after every run of `npm test` (a finding
 * fails the run) and by global-teardown.ts (a warning in partial runs); test/unit/log-leaks.test.ts plants
 * one line of each kind.
 */
import fs from 'node:fs';
import path from 'node:path';

/** What counts as a leaked secret: each pattern matches the secret itself, never its `[redacted]` stand-in. */
export const LEAK_PATTERNS: readonly { kind: string; re: RegExp }[] = [
  // API keys (domain/keys.ts), enrolment secrets and agent tokens (services/agent.ts), sessions, webhook secrets.
  { kind: 'api key', re: /\bsvk_(?:live|test)_(?!\[redacted\])[A-Za-z0-9_-]{16,}/ },
  { kind: 'enrolment secret', re: /\bses_(?!\[redacted\])[A-Za-z0-9_-]{16,}/ },
  { kind: 'agent token', re: /\bsat_(?!\[redacted\])[A-Za-z0-9_-]{16,}/ },
  { kind: 'session token', re: /\bsst_(?!\[redacted\])[A-Za-z0-9_-]{16,}/ },
  { kind: 'webhook secret', re: /\bwhsec_(?!\[redacted\])[A-Za-z0-9_-]{16,}/ },
  // A key in the stream's `?api_key=` in any encoding, and a secret whose prefix is percent-encoded (the
  // server decodes query strings, so `svk%5Flive%5F…` authenticates).
  { kind: 'api_key parameter', re: /[?&]api(?:_|%5F)key=(?!\[redacted\])[^&"'\s\\]{8,}/i },
  { kind: 'percent-encoded secret', re: /\b(?:svk(?:_|%5F)(?:live|test)|ses|sat|sst|whsec)%5F[A-Za-z0-9_%-]{16,}/i },
  // The signature of a SAS URL (blob upload and download URLs).
  { kind: 'SAS signature', re: /[?&](?:amp;)?sig=(?!\[redacted\])[^&"'\s\\]{8,}/i },
  // A credential in a header, as text or as a JSON field.
  { kind: 'Authorization header', re: /\bBearer\s+(?!\[redacted\])[A-Za-z0-9._~+/=-]{16,}/ },
  {
    kind: 'credential field',
    // Also escaped, as inside a logged message or body text (\"authorization\":\"…\").
    re: /\\?"(?:authorization|x-api-key|api_key|apiKey|agentToken|enrolmentSecret|signingSecret|password)\\?"\s*:\s*\\?"(?!\[redacted\])[^"\\]{8,}/i,
  },
];

/** One finding: file, 1-based line number, kind, and the line cut to 300 characters around the match (the secret cut to 12 characters). */
export interface Leak {
  file: string;
  line: number;
  kind: string;
  excerpt: string;
}

/** The leaks in `text` (one log file's content), at most `max`. */
export function findLeaks(text: string, file = '<text>', max = 20): Leak[] {
  const out: Leak[] = [];
  const lines = text.split('\n');
  for (let i = 0; i < lines.length && out.length < max; i++) {
    const l = lines[i];
    for (const { kind, re } of LEAK_PATTERNS) {
      const m = re.exec(l);
      if (!m) continue;
      const from = Math.max(0, m.index - 120);
      const shown = l.slice(0, m.index) + `${m[0].slice(0, 12)}…` + l.slice(m.index + m[0].length);
      out.push({ file, line: i + 1, kind, excerpt: shown.slice(from, from + 300) });
      break;
    }
  }
  return out;
}

/** Summary of one folder's check: files and bytes read, and the leaks found (at most 20 per file). */
export interface LogCheck {
  files: number;
  bytes: number;
  leaks: Leak[];
}

/** Greps every `*.log` file of `dir` (none when the folder is absent). */
export function checkLogDir(dir: string): LogCheck {
  const result: LogCheck = { files: 0, bytes: 0, leaks: [] };
  if (!fs.existsSync(dir)) return result;
  for (const name of fs.readdirSync(dir).filter((n) => n.endsWith('.log'))) {
    const file = path.join(dir, name);
    const text = fs.readFileSync(file, 'utf8');
    result.files++;
    result.bytes += Buffer.byteLength(text);
    result.leaks.push(...findLeaks(text, file));
  }
  return result;
}

/** Human report of a check: one line when clean, else a line per leak. */
export function describeCheck(dir: string, c: LogCheck): string {
  const head = `log check: ${c.files} log files, ${(c.bytes / 1048576).toFixed(1)} MiB in ${dir}`;
  if (c.leaks.length === 0) return `${head}: no secret found`;
  return [
    `${head}: ${c.leaks.length} secret(s) found in the logs`,
    ...c.leaks.map((l) => `  ${l.kind} at ${l.file}:${l.line}: ${l.excerpt}`),
  ].join('\n');
}

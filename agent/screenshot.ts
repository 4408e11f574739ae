/**
 * capture_screenshot on the reference agent (docs/decisions/agent-os.md): Windows captures the screen with
 * PowerShell (`windowsScreenshotScript`; written for Windows, not run here); a host without a display (this
 * Linux one, the fleet simulator) renders a real PNG of the machine's state with pngjs: a header band, one
 * bar for the load average against the CPU count, one for memory in use, and one block per managed process
 * (green running, amber starting or waiting, red failed, grey stopped).
 */
import { execFile } from 'node:child_process';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { promisify } from 'node:util';
import { PNG } from 'pngjs';
import { windowsScreenshotScript } from './os';

/** What the rendered screenshot shows. */
export interface ScreenState {
  machineId: string;
  processes: { status: string }[];
}

const WIDTH = 320;
const HEIGHT = 200;

type Rgb = [number, number, number];

/** A PNG of the machine's state (WIDTH × HEIGHT, RGBA). */
export function renderStatePng(
  state: ScreenState,
  load = os.loadavg()[0] / Math.max(1, os.cpus().length),
  mem = 1 - os.freemem() / os.totalmem(),
): Buffer {
  const png = new PNG({ width: WIDTH, height: HEIGHT });
  const fill = (x0: number, y0: number, w: number, h: number, [r, g, b]: Rgb) => {
    for (let y = Math.max(0, y0); y < Math.min(HEIGHT, y0 + h); y++)
      for (let x = Math.max(0, x0); x < Math.min(WIDTH, x0 + w); x++) {
        const i = (y * WIDTH + x) * 4;
        png.data[i] = r;
        png.data[i + 1] = g;
        png.data[i + 2] = b;
        png.data[i + 3] = 255;
      }
  };
  fill(0, 0, WIDTH, HEIGHT, [24, 28, 36]);
  // Header band coloured from the machine id, so two machines' screenshots differ.
  let hash = 0;
  for (const c of state.machineId) hash = (hash * 31 + c.charCodeAt(0)) >>> 0;
  fill(0, 0, WIDTH, 24, [64 + (hash & 127), 64 + ((hash >> 7) & 127), 64 + ((hash >> 14) & 127)]);
  const bar = (y: number, fraction: number, color: Rgb) => {
    fill(16, y, WIDTH - 32, 16, [48, 52, 64]);
    fill(16, y, Math.round((WIDTH - 32) * Math.max(0, Math.min(1, fraction))), 16, color);
  };
  bar(40, load, [90, 160, 230]);
  bar(64, mem, [200, 120, 220]);
  const colour: Record<string, Rgb> = { running: [60, 200, 90], starting: [230, 180, 40], waiting: [230, 180, 40], failed: [220, 60, 60] };
  state.processes
    .slice(0, 60)
    .forEach((p, i) => fill(16 + (i % 15) * 19, 96 + Math.floor(i / 15) * 22, 16, 16, colour[p.status] ?? [120, 120, 120]));
  return PNG.sync.write(png);
}

/** Captures the screen on Windows (PowerShell, monitor `all`, `primary` or an index) and returns the PNG bytes. */
export async function captureWindowsScreen(monitor: 'all' | 'primary' | number): Promise<Buffer> {
  const out = path.join(os.tmpdir(), `roost-shot-${process.pid}-${Date.now()}.png`);
  await promisify(execFile)('powershell.exe', ['-NoProfile', '-NonInteractive', '-Command', windowsScreenshotScript(out, monitor)], {
    windowsHide: true,
  });
  try {
    return await fs.readFile(out);
  } finally {
    await fs.rm(out, { force: true });
  }
}

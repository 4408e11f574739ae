/**
 * The `site` label of `roost_machine_reports_total` is capped (ROOST_METRICS_MAX_SITES; docs/observability.md
 * "Labels and cardinality"): the first sites to report keep their id, every later site counts as `_other`,
 * read back from the process registry's exposition text.
 */
import { noteTargetReport } from '../../services/observability';
import { metricsText, OTHER_SITES } from '../../telemetry/metrics';
import { parseMetrics } from '../support/metrics';

test('the first N sites keep their own label value, later ones count under _other; totals are kept', async () => {
  const cap = 2;
  for (const site of ['site_aaaa', 'site_bbbb', 'site_cccc', 'site_dddd']) noteTargetReport(site, 'committed', undefined, cap);
  noteTargetReport('site_aaaa', 'failed', undefined, cap); // a labelled site keeps its label
  noteTargetReport('site_dddd', 'failed', 100, cap);
  noteTargetReport('site_eeee', 'downloading', undefined, cap); // not terminal: not counted, takes no label
  const m = parseMetrics((await metricsText()).body);
  const series = m.samples.filter((s) => s.name === 'roost_machine_reports_total');
  expect(new Set(series.map((s) => s.labels.site))).toEqual(new Set(['site_aaaa', 'site_bbbb', OTHER_SITES]));
  expect(series.length).toBeLessThanOrEqual((cap + 1) * 3);
  expect(m.value('roost_machine_reports_total', { site: 'site_aaaa' })).toBe(2);
  expect(m.value('roost_machine_reports_total', { site: OTHER_SITES, status: 'committed' })).toBe(2);
  expect(m.value('roost_machine_reports_total', { site: OTHER_SITES, status: 'failed' })).toBe(1);
  expect(m.value('roost_machine_reports_total')).toBe(6);
  expect(m.value('roost_chunk_bytes_total', { direction: 'served' })).toBe(100);
});

test('a cap of 0 labels no site', async () => {
  noteTargetReport('site_ffff', 'cancelled', undefined, 0);
  const m = parseMetrics((await metricsText()).body);
  expect(m.has('roost_machine_reports_total', { site: 'site_ffff' })).toBe(false);
  expect(m.value('roost_machine_reports_total', { site: OTHER_SITES, status: 'cancelled' })).toBe(1);
});

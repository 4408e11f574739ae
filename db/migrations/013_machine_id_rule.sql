-- One machine-id rule everywhere (domain/schemas.ts MACHINE_ID_RE, docs/decisions/machine-ids.md): 1..64 of
-- [A-Za-z0-9._-], the enrolment rule. Roost targets used to accept 1..128 characters and ':', ids that can
-- never enrol; a rollout to them could only wait out its timeout. Such targets are dropped (order kept).
UPDATE roosts
SET targets = COALESCE(
  (SELECT jsonb_agg(e.t ORDER BY e.i)
   FROM jsonb_array_elements_text(roosts.targets) WITH ORDINALITY AS e(t, i)
   WHERE e.t ~ '^[A-Za-z0-9._-]{1,64}$'),
  '[]'::jsonb)
WHERE EXISTS (
  SELECT 1 FROM jsonb_array_elements_text(roosts.targets) AS x(t) WHERE x.t !~ '^[A-Za-z0-9._-]{1,64}$'
);

-- Machine ids made only of dots (`.`, `..`, …) are refused from now on (domain/schemas.ts MACHINE_ID_RE,
-- docs/decisions/machine-ids.md): every URL client normalises such a path segment away, so no machine route
-- could name that machine. Such roost targets are dropped (order kept), as 013_machine_id_rule.sql did for the
-- ids of the older, wider rule. Machines already enrolled under such an id keep their rows.
UPDATE roosts
SET targets = COALESCE(
  (SELECT jsonb_agg(e.t ORDER BY e.i)
   FROM jsonb_array_elements_text(roosts.targets) WITH ORDINALITY AS e(t, i)
   WHERE e.t !~ '^\.+$'),
  '[]'::jsonb)
WHERE EXISTS (
  SELECT 1 FROM jsonb_array_elements_text(roosts.targets) AS x(t) WHERE x.t ~ '^\.+$'
);

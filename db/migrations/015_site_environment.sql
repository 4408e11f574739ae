-- Every site has an environment (docs/decisions/test-keys.md): 'live' (the default, production data) or
-- 'test' (a sandbox site). An API key acts only on sites of its own environment: svk_test_ keys on sandbox
-- sites, svk_live_ keys on live ones (api/plugins/auth.ts authorizeSite).
ALTER TABLE sites ADD COLUMN IF NOT EXISTS environment TEXT NOT NULL DEFAULT 'live' CHECK (environment IN ('live', 'test'));

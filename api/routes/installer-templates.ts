/**
 * Installer templates (site scoped; docs/decisions/classic-deployments.md): defaults for classic deployments
 * (`template_id` of `POST /api/sites/{siteId}/deployments`). Not the platform's agent-installer catalog.
 * The use cases are services/classic-deployments.ts.
 *
 *   POST   /api/sites/{siteId}/installer-templates                 create (site write, Idempotency-Key)
 *   GET    /api/sites/{siteId}/installer-templates                 list, newest first (site read; 1..100, default 25)
 *   GET    /api/sites/{siteId}/installer-templates/{templateId}    one template (site read)
 *   PATCH  /api/sites/{siteId}/installer-templates/{templateId}    change fields (site write, Idempotency-Key)
 *   DELETE /api/sites/{siteId}/installer-templates/{templateId}    delete (site write, Idempotency-Key)
 */
import { type Static, Type } from '@sinclair/typebox';
import type { FastifyPluginAsyncTypebox } from '@fastify/type-provider-typebox';
import { DEPLOYMENT_ID_RE, MAX_INSTALL_TIMEOUT_SECONDS } from '../../domain/classic';
import {
  DateTime,
  FileName,
  HttpsUrl,
  MachinePath,
  Nullable,
  PageTokens,
  pagingQuery,
  SiteId,
  isCreatedAtPosition,
  problems,
} from '../../domain/schemas';
import {
  type TemplateRow,
  createTemplate,
  deleteTemplate,
  listSiteTemplates,
  templateDetail,
  updateTemplate,
} from '../../services/classic-deployments';
import { authorizeSite, siteRequirement } from '../plugins/auth';
import { parsePaging } from '../pagination';
import { enforceCapability } from '../ratelimit/limits';

/** `GET /api/sites/{siteId}/installer-templates` page size (as the deployment list: 1..100, default 25). */
const TEMPLATE_PAGE = { defaultSize: 25, maxSize: 100 };

const TemplateId = Type.String({ pattern: DEPLOYMENT_ID_RE.source, description: 'template id (itp_…)' });
const SiteParams = Type.Object({ siteId: SiteId });
const TemplateParams = Type.Object({ siteId: SiteId, templateId: TemplateId });

const fields = {
  name: Type.String({ minLength: 1, maxLength: 200 }),
  installer_name: FileName('installer file name'),
  installer_url: HttpsUrl('HTTPS URL'),
  silent_flags: Type.String({ maxLength: 2000 }),
  verify_path: Nullable(MachinePath('absolute path that must exist after install')),
  close_processes: Type.Array(FileName('executable closed before install (e.g. app.exe)'), { maxItems: 100 }),
  timeout_seconds: Nullable(
    Type.Integer({ minimum: 1, maximum: MAX_INSTALL_TIMEOUT_SECONDS, description: 'installer run time limit (seconds)' }),
  ),
};

const CreateBody = Type.Object(
  {
    name: fields.name,
    installer_name: fields.installer_name,
    installer_url: fields.installer_url,
    silent_flags: Type.Optional(fields.silent_flags),
    verify_path: Type.Optional(fields.verify_path),
    close_processes: Type.Optional(fields.close_processes),
    timeout_seconds: Type.Optional(fields.timeout_seconds),
  },
  { additionalProperties: false },
);
const PatchBody = Type.Partial(Type.Object(fields), { additionalProperties: false, minProperties: 1 });

/** An installer template record (the spec's snake_case field names plus ids and timestamps). */
export const TemplateRecord = Type.Object({
  templateId: Type.String(),
  siteId: Type.String(),
  name: Type.String(),
  installer_name: Type.String(),
  installer_url: Type.String(),
  silent_flags: Type.String(),
  verify_path: Nullable(Type.String()),
  close_processes: Type.Array(Type.String()),
  timeout_seconds: Nullable(Type.Integer()),
  createdAt: DateTime,
  updatedAt: DateTime,
});

function record(t: TemplateRow): Static<typeof TemplateRecord> {
  return {
    templateId: t.template_id,
    siteId: t.site_id,
    name: t.name,
    installer_name: t.installer_name,
    installer_url: t.installer_url,
    silent_flags: t.silent_flags,
    verify_path: t.verify_path,
    close_processes: t.close_processes,
    timeout_seconds: t.timeout_seconds,
    createdAt: t.created_at.toISOString(),
    updatedAt: t.updated_at.toISOString(),
  };
}

const read = (siteId: string) => siteRequirement(siteId, 'read');
const write = (siteId: string) => siteRequirement(siteId, 'write');

const installerTemplateRoutes: FastifyPluginAsyncTypebox = async (app) => {
  const tags = ['classic-deployments'];

  app.post(
    '/api/sites/:siteId/installer-templates',
    {
      config: { idempotency: 'required' },
      schema: {
        tags,
        summary: 'Create an installer template',
        params: SiteParams,
        body: CreateBody,
        response: { 201: TemplateRecord, ...problems(409, 422) },
      },
    },
    async (request, reply) => {
      const { siteId } = request.params;
      const user = await authorizeSite(request, siteId, write(siteId));
      await enforceCapability(request, 'DEPLOYMENT_MANAGE', siteId);
      const b = request.body;
      const row = await createTemplate(app.deps, {
        siteId,
        userId: user.userId,
        fields: {
          name: b.name,
          installer_name: b.installer_name,
          installer_url: b.installer_url,
          silent_flags: b.silent_flags ?? '',
          verify_path: b.verify_path ?? null,
          close_processes: b.close_processes ?? [],
          timeout_seconds: b.timeout_seconds ?? null,
        },
      });
      return reply.code(201).send(record(row));
    },
  );

  app.get(
    '/api/sites/:siteId/installer-templates',
    {
      schema: {
        tags,
        summary: 'List installer templates, newest first',
        params: SiteParams,
        querystring: Type.Object(pagingQuery(TEMPLATE_PAGE)),
        response: { 200: Type.Object({ templates: Type.Array(TemplateRecord), ...PageTokens }), ...problems() },
      },
    },
    async (request) => {
      const { siteId } = request.params;
      const paging = parsePaging(request, { ...TEMPLATE_PAGE, accept: isCreatedAtPosition });
      await authorizeSite(request, siteId, read(siteId));
      const page = await listSiteTemplates(app.deps, { siteId, pageSize: paging.pageSize, after: paging.after });
      return { templates: page.templates.map(record), ...paging.tokens(page.next) };
    },
  );

  app.get(
    '/api/sites/:siteId/installer-templates/:templateId',
    { schema: { tags, summary: 'One installer template', params: TemplateParams, response: { 200: TemplateRecord, ...problems() } } },
    async (request) => {
      const { siteId, templateId } = request.params;
      await authorizeSite(request, siteId, read(siteId));
      return record(await templateDetail(app.deps, { siteId, templateId }));
    },
  );

  app.patch(
    '/api/sites/:siteId/installer-templates/:templateId',
    {
      config: { idempotency: 'required' },
      schema: {
        tags,
        summary: 'Change fields of an installer template',
        params: TemplateParams,
        body: PatchBody,
        response: { 200: TemplateRecord, ...problems(409, 422) },
      },
    },
    async (request) => {
      const { siteId, templateId } = request.params;
      await authorizeSite(request, siteId, write(siteId));
      await enforceCapability(request, 'DEPLOYMENT_MANAGE', siteId);
      return record(await updateTemplate(app.deps, { siteId, templateId, fields: request.body }));
    },
  );

  app.delete(
    '/api/sites/:siteId/installer-templates/:templateId',
    {
      config: { idempotency: 'required' },
      schema: {
        tags,
        summary: 'Delete an installer template (deployments made from it keep their fields)',
        params: TemplateParams,
        response: { 200: Type.Object({ templateId: Type.String(), deleted: Type.Literal(true) }), ...problems(422) },
      },
    },
    async (request) => {
      const { siteId, templateId } = request.params;
      await authorizeSite(request, siteId, write(siteId));
      await enforceCapability(request, 'DEPLOYMENT_MANAGE', siteId);
      return deleteTemplate(app.deps, { siteId, templateId });
    },
  );
};

export default installerTemplateRoutes;

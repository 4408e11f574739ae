/**
 * Which language model answers conversation sends (docs/decisions/cortex.md "Model"; README "Fleet
 * assistant"). The small interface is the AI SDK's language model (LanguageModelV3): every provider the SDK
 * supports fits behind it, chosen by configuration only:
 *
 * - ROOST_CORTEX_PROVIDER=local (default): the built-in retrieval assistant (services/cortex-local.ts);
 * - ROOST_CORTEX_PROVIDER=openai-compatible: ROOST_CORTEX_BASE_URL + ROOST_CORTEX_MODEL (+ ROOST_CORTEX_API_KEY,
 *   sent as a Bearer token or, with ROOST_CORTEX_API_KEY_HEADER=api-key, as Azure OpenAI's `api-key`);
 * - ROOST_CORTEX_PROVIDER=none: no model; sends are 503 cortex_unavailable naming the setting.
 *
 * Tests (and embedders) may set `deps.cortexModel` to any LanguageModelV3, which then answers instead.
 */
import type { LanguageModelV3 } from '@ai-sdk/provider';
import { createOpenAICompatible } from '@ai-sdk/openai-compatible';
import type { Config } from '../config/env';
import { ApiError } from '../domain/errors';
import { createLocalAssistantModel } from './cortex-local';
import type { ServiceDeps } from './deps';

/** The model that answers, and the name stored with each reply (`provider/modelId`). */
export interface CortexModel {
  model: LanguageModelV3;
  name: string;
}

/** 503 cortex_unavailable: no model can answer (the detail names the setting to change). */
function unavailable(detail: string): ApiError {
  return new ApiError('cortex_unavailable', detail, { status: 503, headers: { 'Retry-After': '60' } });
}

/** Models built from configuration, by the settings they were built from. */
const built = new Map<string, LanguageModelV3>();

function fromConfig(cfg: Config): LanguageModelV3 {
  const settings = JSON.stringify([
    cfg.ROOST_CORTEX_PROVIDER,
    cfg.ROOST_CORTEX_BASE_URL,
    cfg.ROOST_CORTEX_MODEL,
    cfg.ROOST_CORTEX_API_KEY,
    cfg.ROOST_CORTEX_API_KEY_HEADER,
  ]);
  const cached = built.get(settings);
  if (cached) return cached;
  let model: LanguageModelV3;
  switch (cfg.ROOST_CORTEX_PROVIDER) {
    case 'local':
      model = createLocalAssistantModel();
      break;
    case 'openai-compatible': {
      const missing = (['ROOST_CORTEX_BASE_URL', 'ROOST_CORTEX_MODEL'] as const).filter((k) => !cfg[k]);
      if (missing.length) throw unavailable(`ROOST_CORTEX_PROVIDER is openai-compatible but ${missing.join(' and ')} is not set`);
      const key = cfg.ROOST_CORTEX_API_KEY;
      const provider = createOpenAICompatible({
        name: 'roost-cortex',
        baseURL: cfg.ROOST_CORTEX_BASE_URL!,
        includeUsage: true,
        ...(key && cfg.ROOST_CORTEX_API_KEY_HEADER === 'authorization' ? { apiKey: key } : {}),
        ...(key && cfg.ROOST_CORTEX_API_KEY_HEADER === 'api-key' ? { headers: { 'api-key': key } } : {}),
      });
      model = provider.chatModel(cfg.ROOST_CORTEX_MODEL!);
      break;
    }
    case 'none':
      throw unavailable('no assistant model is configured: set ROOST_CORTEX_PROVIDER to local or openai-compatible');
  }
  built.set(settings, model);
  return model;
}

/**
 * The model for the next reply.
 * @throws ApiError cortex_unavailable (503) when none is configured or its settings are incomplete.
 */
export function cortexModel(deps: Pick<ServiceDeps, 'cfg' | 'cortexModel'>): CortexModel {
  const model = deps.cortexModel ?? fromConfig(deps.cfg);
  return { model, name: `${model.provider}/${model.modelId}` };
}

/** True when a reply could be produced now (a model is configured with complete settings). */
export function cortexConfigured(deps: Pick<ServiceDeps, 'cfg' | 'cortexModel'>): boolean {
  try {
    cortexModel(deps);
    return true;
  } catch {
    return false;
  }
}

/** Version of the `roost` CLI (package.json `version`), emitted as `config.cliVersion` and in User-Agent. */
import { version } from '../package.json';

export const CLI_VERSION: string = version;

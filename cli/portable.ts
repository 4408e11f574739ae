/**
 * Entry point of the packaged `roost` executable (scripts/build-agent.ts bundles this file and Node's
 * single-executable-application support turns it into `roost` / `roost.exe`): every API command and
 * `roost agent`, without `stack`, `admin` and `demo`, which run local services and need the repository.
 */
import { baseProgram, runProgram } from './program';

void runProgram(baseProgram, process.argv);

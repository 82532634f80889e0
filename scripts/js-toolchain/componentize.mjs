// Builds one JavaScript guest: componentize-js's own CLI, except that Wizer (which it runs to
// pre-initialize the engine) keeps its wasmtime compile cache where XDG_CACHE_HOME says: the
// CLI starts Wizer with an empty environment, so the cache would land in ~/.cache, outside
// the checkout. The cache takes a build from about 22 s to 9 s.
//
//   node componentize.mjs <componentize-js module> <wit> <world> <handler.js> <out.wasm>
//
// scripts/build-guests.sh runs it with the module that scripts/prepare.sh installed.

import { writeFile } from 'node:fs/promises';
import { resolve } from 'node:path';
import { pathToFileURL } from 'node:url';

const [moduleDir, wit, world, source, out] = process.argv.slice(2);
if (!out) {
  console.error('usage: componentize.mjs <componentize-js dir> <wit> <world> <handler.js> <out.wasm>');
  process.exit(2);
}
const cache = process.env.XDG_CACHE_HOME;
const { componentize } = await import(
  pathToFileURL(resolve(moduleDir, 'src/componentize.js')).href
);
const { component } = await componentize({
  sourcePath: source,
  witPath: resolve(wit),
  worldName: world,
  env: cache ? { XDG_CACHE_HOME: resolve(cache) } : {},
});
await writeFile(out, component);

// Writes the package's browser build where the app's own pages load it: runs/static/runs/runledger-client.js
// (the global `Runledger`, as dist/browser/runledger.js, but minified) and, beside it, its source map
// runledger-client.js.map (the TypeScript sources inside it), under a header that names the package's
// version and its source. The app's wheel ships both, so a site installed with pip needs no npm
// (docs/design/clients.md#browser). `npm run build:static` builds and writes them;
// `node scripts/static.mjs <path>` writes the same bytes elsewhere (<path> and <path>.map), for
// tests/client/test_js_static.py, which fails while the committed files are not what a fresh build writes.
import { readFileSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { build } from "esbuild";

const here = dirname(fileURLToPath(import.meta.url));
const pkg = join(here, "..");
// The map's sources are relative to where the pages load the script, wherever these bytes are written.
const committed = join(pkg, "..", "..", "runs", "static", "runs", "runledger-client.js");
const target = process.argv[2] ?? committed;
const { name, version } = JSON.parse(readFileSync(join(pkg, "package.json"), "utf8"));
const header = [
  `// ${name} ${version}: the package's browser build (the global \`Runledger\`), from clients/js/src, minified;`,
  "// its source map is beside it. Generated, do not edit: `npm run build:static` in clients/js writes it anew.",
].join("\n");
const { outputFiles } = await build({
  entryPoints: [join(pkg, "src", "index.ts")],
  bundle: true,
  format: "iife",
  globalName: "Runledger",
  target: "es2020",
  minify: true,
  sourcemap: "linked",
  banner: { js: header },
  outfile: committed,
  write: false,
  logLevel: "warning",
});
for (const file of outputFiles) {
  writeFileSync(file.path.endsWith(".map") ? `${target}.map` : target, file.contents);
}

// Writes the package's browser build (dist/browser/runledger.js, made by `npm run build`) where the
// app's own pages load it, runs/static/runs/runledger-client.js, under a header that names the
// package's version and its source. The app's wheel ships that file, so a site installed with pip
// needs no npm (docs/design/clients.md#browser). `npm run build:static` builds and writes it;
// `node scripts/static.mjs <path>` writes the same bytes elsewhere, for tests/client/test_js_static.py,
// which fails while the committed file is not what a fresh build writes.
import { readFileSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const here = dirname(fileURLToPath(import.meta.url));
const pkg = join(here, "..");
const target = process.argv[2] ?? join(pkg, "..", "..", "runs", "static", "runs", "runledger-client.js");
const { name, version } = JSON.parse(readFileSync(join(pkg, "package.json"), "utf8"));
const bundle = readFileSync(join(pkg, "dist", "browser", "runledger.js"), "utf8");
const header = [
  `// ${name} ${version}: the package's browser build (the global \`Runledger\`), from clients/js/src.`,
  "// Generated, do not edit: `npm run build:static` in clients/js writes it anew.",
  "",
].join("\n");
writeFileSync(target, header + bundle);

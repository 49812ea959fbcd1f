// Builds the pages into dist/ (or --outDir) with relative asset paths, so
// the Go test can serve them under any prefix. No dev server, no network.
import { defineConfig } from "vite";

export default defineConfig({
  base: "./",
  logLevel: "error",
  esbuild: { jsx: "automatic" },
  build: {
    sourcemap: false, minify: false, reportCompressedSize: false,
    rollupOptions: { input: { main: "index.html", chatui: "chatui.html" } },
  },
});

// Chapter 10's MiniLM in a Web Worker, so that typing never waits for the model.
//
// live.js starts it (a module worker) when the reader presses the download button, and sends
//   {type: "load", ort, wasmPaths, model}   the runtime's module, its folder, the model's URL
//   {type: "run", id, ids}                  the word-piece ids of one sentence ([CLS] ... [SEP])
// and gets back
//   {type: "progress", loaded, total}       while the model downloads
//   {type: "ready", seconds}                the session is created
//   {type: "result", id, T, attentions, ms} attentions: Float32Array (6, 12, T, T), ms: inference
//   {type: "error", message}
// onnxruntime-web's wasm backend runs single-threaded (numThreads 1): no cross-origin isolation
// headers are needed, and no further worker is started.
let ort = null;
let session = null;

async function download(url) {
  const response = await fetch(url);
  if (!response.ok) throw new Error(`${url}: HTTP ${response.status}`);
  const total = Number(response.headers.get("content-length")) || 0;
  const reader = response.body.getReader();
  const parts = [];
  let loaded = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    parts.push(value);
    loaded += value.length;
    postMessage({ type: "progress", loaded, total });
  }
  const bytes = new Uint8Array(loaded);
  let at = 0;
  for (const part of parts) { bytes.set(part, at); at += part.length; }
  return bytes;
}

self.onmessage = async ({ data }) => {
  try {
    if (data.type === "load") {
      const start = performance.now();
      ort = await import(data.ort);
      ort.env.wasm.numThreads = 1;
      ort.env.wasm.wasmPaths = data.wasmPaths;
      const model = await download(data.model);
      session = await ort.InferenceSession.create(model, { executionProviders: ["wasm"] });
      postMessage({ type: "ready", seconds: (performance.now() - start) / 1000 });
    } else if (data.type === "run") {
      const T = data.ids.length;
      const ids = new ort.Tensor("int64", BigInt64Array.from(data.ids, BigInt), [1, T]);
      const start = performance.now();
      const out = await session.run({ input_ids: ids });
      const ms = performance.now() - start;
      const attentions = out.attentions.data; // (6, 12, T, T), float32
      postMessage({ type: "result", id: data.id, T, attentions, ms }, [attentions.buffer]);
    }
  } catch (error) {
    postMessage({ type: "error", message: String(error && error.message || error) });
  }
};

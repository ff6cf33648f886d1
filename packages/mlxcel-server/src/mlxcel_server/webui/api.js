// Calls to this server's API: the bearer key, error answers as ApiError, the chat stream
// (server-sent events) and the speech endpoints. Paths are relative to the page, so the page
// works behind a reverse proxy that serves it under a prefix.

const KEY_STORAGE = "mlxcel.apiKey";
const LOST =
  "The connection to the server was lost before the reply finished.";

/** An answer other than 2xx, an error event in a stream, or a dropped connection (status 0). */
export class ApiError extends Error {
  constructor(message, { status = 0, retryAfter = null } = {}) {
    super(message);
    this.name = "ApiError";
    this.status = status;
    this.retryAfter = retryAfter;
  }
}

export function apiKey() {
  return localStorage.getItem(KEY_STORAGE) ?? "";
}

export function setApiKey(key) {
  localStorage.setItem(KEY_STORAGE, key);
}

async function send(path, init = {}) {
  const headers = { ...init.headers };
  const key = apiKey();
  if (key) headers.Authorization = `Bearer ${key}`;
  let response;
  try {
    response = await fetch(path, { ...init, headers });
  } catch (error) {
    if (error.name === "AbortError") throw error;
    throw new ApiError(`Cannot reach the server (${error.message}).`);
  }
  if (!response.ok) throw await errorOf(response);
  return response;
}

async function errorOf(response) {
  let message = `${response.status} ${response.statusText}`.trim();
  try {
    const body = await response.json();
    if (typeof body?.error?.message === "string") message = body.error.message;
  } catch {
    // Not an OpenAI error body (a proxy's page): the status line says what happened.
  }
  const retryAfter = response.headers.get("Retry-After");
  return new ApiError(message, {
    status: response.status,
    retryAfter: retryAfter === null ? null : Number(retryAfter),
  });
}

/** llama-server's `GET /props`: the model, its defaults and what else the server serves. */
export async function getProps() {
  return (await send("props")).json();
}

/**
 * Streams `POST /v1/chat/completions`, yielding each chunk. Aborting `signal` closes the
 * connection, which cancels the request on the server and frees its slot.
 */
export async function* streamChat(body, signal) {
  const response = await send("v1/chat/completions", {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ ...body, stream: true, stream_options: { include_usage: true } }),
    signal,
  });
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    let chunk;
    try {
      chunk = await reader.read();
    } catch (error) {
      if (signal.aborted) throw error;
      throw new ApiError(LOST);
    }
    if (chunk.done) throw new ApiError(LOST);
    buffer += chunk.value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const data = buffer
        .slice(0, end)
        .split("\n")
        .filter((line) => line.startsWith("data:"))
        .map((line) => line.slice(5).trimStart())
        .join("\n");
      buffer = buffer.slice(end + 2);
      if (data === "[DONE]") return;
      if (!data) continue;
      const event = JSON.parse(data);
      if (event.error) throw new ApiError(event.error.message ?? "The server ended the reply.");
      yield event;
    }
  }
}

/** The text of a recording, through `POST /v1/audio/transcriptions`. */
export async function transcribe(wav) {
  const form = new FormData();
  form.append("file", wav, "recording.wav");
  form.append("response_format", "json");
  const response = await send("v1/audio/transcriptions", { method: "POST", body: form });
  return (await response.json()).text;
}

/** `text` spoken as a WAV file, through `POST /v1/audio/speech`. */
export async function speak(text) {
  const response = await send("v1/audio/speech", {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ input: text, response_format: "wav" }),
  });
  return response.blob();
}

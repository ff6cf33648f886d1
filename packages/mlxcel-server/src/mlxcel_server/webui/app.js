// The chat page: conversations with the server's model through its own
// /v1/chat/completions, streamed, with the settings, images and speech the server offers.

import { ApiError, apiKey, getProps, setApiKey, speak, streamChat, transcribe } from "./api.js";
import { canRecord, startRecording } from "./audio.js";
import { SettingsDrawer, defaultsFrom } from "./settings.js";
import { loadConversations, newConversation, saveConversations } from "./store.js";
import { drawConversationList, drawMessages, updateMessage } from "./view.js";

const $ = (selector) => document.querySelector(selector);

const page = {
  conversations: loadConversations(),
  current: null,
  controller: null, // aborts the reply streaming now
  images: [], // data URLs waiting to be sent
  speech: { stt: null, tts: null },
  stopRecording: null,
};
page.current = page.conversations[0] ?? newConversation();
const settings = new SettingsDrawer($("#settings"));

function setStatus(text) {
  $("#status").textContent = text;
}

function save() {
  if (!saveConversations(page.conversations)) {
    setStatus("The browser's storage is full: this conversation is not saved.");
  }
}

function draw() {
  drawConversationList($("#conversations"), page.conversations, page.current, {
    open(conversation) {
      page.current = conversation;
      draw();
    },
    remove(conversation) {
      if (conversation === page.current && page.controller) page.controller.abort();
      page.conversations = page.conversations.filter((c) => c !== conversation);
      if (conversation === page.current) page.current = page.conversations[0] ?? newConversation();
      save();
      draw();
    },
  });
  drawMessages($("#messages"), page.current, {
    busy: page.controller !== null,
    regenerate,
    edit,
    speak: page.speech.tts ? play : null,
  });
  $("#send").hidden = page.controller !== null;
  $("#stop").hidden = page.controller === null;
}

/** The request's messages: the system prompt, then the conversation without its errors. */
function requestMessages(conversation) {
  const messages = [];
  const system = settings.systemPrompt();
  if (system) messages.push({ role: "system", content: system });
  for (const message of conversation.messages) {
    if (message.role === "error") continue;
    if (message.images?.length) {
      const parts = message.content ? [{ type: "text", text: message.content }] : [];
      for (const url of message.images) parts.push({ type: "image_url", image_url: { url } });
      messages.push({ role: message.role, content: parts });
    } else {
      messages.push({ role: message.role, content: message.content });
    }
  }
  return messages;
}

function describeError(error) {
  if (!error.status) return error.message;
  const retry = error.retryAfter === null ? "" : ` (retry in ${error.retryAfter} s)`;
  return `Error ${error.status}: ${error.message}${retry}`;
}

function showError(conversation, error) {
  conversation.messages.push({ role: "error", content: describeError(error) });
  if (error.status === 401) askForKey(error.message);
}

async function reply() {
  const conversation = page.current;
  const body = { messages: requestMessages(conversation), ...settings.requestFields() };
  const message = { role: "assistant", content: "", reasoning: "" };
  conversation.messages.push(message);
  conversation.updated = Date.now();
  const controller = new AbortController();
  page.controller = controller;
  save();
  draw();
  let frame = null; // the redraw waiting for the next animation frame
  const redraw = () => {
    frame = null;
    // The reply is its conversation's last message, drawn last while it streams.
    if (conversation === page.current) updateMessage($("#messages").lastElementChild, message);
  };
  try {
    for await (const event of streamChat(body, controller.signal)) {
      for (const choice of event.choices ?? []) {
        message.content += choice.delta?.content ?? "";
        message.reasoning += choice.delta?.reasoning_content ?? "";
        message.finish = choice.finish_reason ?? message.finish;
      }
      message.usage = event.usage ?? message.usage;
      message.timings = event.timings ?? message.timings;
      frame ??= requestAnimationFrame(redraw);
    }
  } catch (error) {
    if (error.name === "AbortError") {
      message.stopped = true;
    } else {
      if (!message.content && !message.reasoning) {
        conversation.messages.splice(conversation.messages.indexOf(message), 1);
      }
      showError(conversation, error);
    }
  } finally {
    if (frame !== null) cancelAnimationFrame(frame);
    message.done = true;
    page.controller = null;
    conversation.updated = Date.now();
    save();
    draw();
  }
}

function dropTrailingReplies(conversation) {
  while (conversation.messages.length && conversation.messages.at(-1).role !== "user") {
    conversation.messages.pop();
  }
}

function regenerate() {
  dropTrailingReplies(page.current);
  reply();
}

function edit(message, text) {
  const messages = page.current.messages;
  messages.splice(messages.indexOf(message) + 1);
  message.content = text;
  reply();
}

function sendMessage() {
  const text = $("#input").value.trim();
  if (page.controller || (!text && page.images.length === 0)) return;
  const conversation = page.current;
  if (!page.conversations.includes(conversation)) page.conversations.unshift(conversation);
  if (conversation.messages.length === 0) conversation.title = text.slice(0, 60) || "Image";
  conversation.messages.push({ role: "user", content: text, images: page.images });
  $("#input").value = "";
  page.images = [];
  drawAttachments();
  reply();
}

/** Speech errors go to the status line: they are not part of the conversation. */
function reportSpeechError(error) {
  setStatus(error instanceof ApiError ? describeError(error) : `Speech failed: ${error.message}`);
  if (error.status === 401) askForKey(error.message);
}

async function play(message) {
  try {
    const audio = new Audio(URL.createObjectURL(await speak(message.content)));
    audio.addEventListener("ended", () => URL.revokeObjectURL(audio.src));
    await audio.play();
  } catch (error) {
    reportSpeechError(error);
  }
}

async function toggleRecording() {
  const button = $("#record");
  if (page.stopRecording) {
    const stop = page.stopRecording;
    page.stopRecording = null;
    button.textContent = "Mic";
    setStatus("Transcribing…");
    try {
      const text = await transcribe(await stop());
      const input = $("#input");
      input.value = [input.value.trim(), text.trim()].filter(Boolean).join(" ");
      input.focus();
      setStatus("");
    } catch (error) {
      reportSpeechError(error);
    }
    return;
  }
  try {
    page.stopRecording = await startRecording();
    button.textContent = "Stop recording";
    setStatus("Recording…");
  } catch (error) {
    setStatus(`The microphone is not available (${error.message}).`);
  }
}

function addImages(files) {
  for (const file of files) {
    if (!file.type.startsWith("image/")) continue;
    const reader = new FileReader();
    reader.addEventListener("load", () => {
      page.images.push(reader.result);
      drawAttachments();
    });
    reader.readAsDataURL(file);
  }
}

function drawAttachments() {
  $("#attachments").replaceChildren(
    ...page.images.map((url, index) => {
      const image = document.createElement("img");
      image.src = url;
      image.alt = "image to send";
      image.title = "Click to remove";
      image.addEventListener("click", () => {
        page.images.splice(index, 1);
        drawAttachments();
      });
      return image;
    }),
  );
}

function askForKey(reason) {
  $("#key-reason").textContent = reason
    ? `${reason}. Enter this server's API key.`
    : "This server needs an API key.";
  $("#key-input").value = apiKey();
  if (!$("#key-dialog").open) $("#key-dialog").showModal();
}

/** Reads `/props`: the model's name and defaults, and what the page offers with it. */
async function connect() {
  try {
    const props = await getProps();
    $("#model-name").textContent = props.model_alias ?? "mlxcel";
    settings.setDefaults(defaultsFrom(props));
    page.speech = props.speech_models ?? { stt: null, tts: null };
    $("#attach").hidden = !props.modalities?.vision;
    $("#record").hidden = !(page.speech.stt && canRecord());
    setStatus("");
    draw();
  } catch (error) {
    if (error.status === 401) {
      askForKey(error.message);
    } else if (error.status === 503 && error.retryAfter !== null) {
      setStatus(`${error.message}…`);
      setTimeout(connect, 1000 * Math.max(error.retryAfter, 1));
    } else {
      setStatus(describeError(error));
    }
  }
}

function listen() {
  $("#composer").addEventListener("submit", (event) => {
    event.preventDefault();
    sendMessage();
  });
  $("#input").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      sendMessage();
    }
  });
  $("#input").addEventListener("paste", (event) => {
    if ($("#attach").hidden) return;
    const files = [...(event.clipboardData?.files ?? [])];
    if (files.some((file) => file.type.startsWith("image/"))) {
      event.preventDefault();
      addImages(files);
    }
  });
  $("#stop").addEventListener("click", () => page.controller?.abort());
  $("#attach").addEventListener("click", () => $("#image-input").click());
  $("#image-input").addEventListener("change", (event) => {
    addImages(event.target.files);
    event.target.value = "";
  });
  $("#record").addEventListener("click", toggleRecording);
  $("#new-chat").addEventListener("click", () => {
    page.current = newConversation();
    draw();
    $("#input").focus();
  });
  $("#open-settings").addEventListener("click", () => settings.toggle());
  $("#key-form").addEventListener("submit", () => {
    setApiKey($("#key-input").value.trim());
    connect();
  });
}

listen();
draw();
connect();

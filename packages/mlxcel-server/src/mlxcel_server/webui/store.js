// What the page keeps in the browser's local storage: the conversations and the settings.

const CONVERSATIONS = "mlxcel.conversations";
const SETTINGS = "mlxcel.settings";

/** Conversations, most recently updated first. */
export function loadConversations() {
  const list = readJson(CONVERSATIONS, []);
  return Array.isArray(list) ? list.sort((a, b) => b.updated - a.updated) : [];
}

/** Stores `conversations`; false when the browser refuses (its storage quota is full). */
export function saveConversations(conversations) {
  return writeJson(CONVERSATIONS, conversations.filter((c) => c.messages.length > 0));
}

export function newConversation() {
  // Not crypto.randomUUID: it exists only in secure contexts, and the page may be
  // served over plain HTTP on a local network.
  const id = Date.now().toString(36) + Math.random().toString(36).slice(2, 10);
  return { id, title: "New chat", updated: Date.now(), messages: [] };
}

/** The settings the user changed, by name (`temperature`, `system`, ...). */
export function loadSettings() {
  const settings = readJson(SETTINGS, {});
  return settings && typeof settings === "object" ? settings : {};
}

export function saveSettings(settings) {
  return writeJson(SETTINGS, settings);
}

function readJson(key, fallback) {
  try {
    return JSON.parse(localStorage.getItem(key)) ?? fallback;
  } catch {
    return fallback;
  }
}

function writeJson(key, value) {
  try {
    localStorage.setItem(key, JSON.stringify(value));
    return true;
  } catch {
    return false;
  }
}

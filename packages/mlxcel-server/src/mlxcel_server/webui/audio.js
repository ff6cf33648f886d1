// The microphone: records until stopped, then hands back the recording as a WAV file.
// Browsers record compressed containers (WebM, MP4) that the server's decoder may not read,
// so the recording is decoded here and written as 16-bit PCM WAV, which every server reads.

export function canRecord() {
  // getUserMedia exists only in secure contexts (https, localhost).
  return Boolean(navigator.mediaDevices?.getUserMedia && window.MediaRecorder);
}

/** Starts recording; the returned function stops it and resolves to a WAV Blob. */
export async function startRecording() {
  const stream = await navigator.mediaDevices.getUserMedia({ audio: true });
  const recorder = new MediaRecorder(stream);
  const parts = [];
  recorder.addEventListener("dataavailable", (event) => parts.push(event.data));
  const stopped = new Promise((resolve) => recorder.addEventListener("stop", resolve));
  recorder.start();
  return async () => {
    recorder.stop();
    await stopped;
    for (const track of stream.getTracks()) track.stop();
    const recorded = await new Blob(parts, { type: recorder.mimeType }).arrayBuffer();
    const context = new AudioContext();
    try {
      return encodeWav(await context.decodeAudioData(recorded));
    } finally {
      context.close();
    }
  };
}

/** The first channel of `buffer` (an AudioBuffer) as a mono 16-bit PCM WAV Blob. */
export function encodeWav(buffer) {
  const samples = buffer.getChannelData(0);
  const view = new DataView(new ArrayBuffer(44 + 2 * samples.length));
  const text = (offset, value) => {
    for (let i = 0; i < value.length; i += 1) view.setUint8(offset + i, value.charCodeAt(i));
  };
  text(0, "RIFF");
  view.setUint32(4, 36 + 2 * samples.length, true);
  text(8, "WAVE");
  text(12, "fmt ");
  view.setUint32(16, 16, true); // size of the fmt chunk
  view.setUint16(20, 1, true); // PCM
  view.setUint16(22, 1, true); // one channel
  view.setUint32(24, buffer.sampleRate, true);
  view.setUint32(28, 2 * buffer.sampleRate, true); // bytes per second
  view.setUint16(32, 2, true); // bytes per frame
  view.setUint16(34, 16, true); // bits per sample
  text(36, "data");
  view.setUint32(40, 2 * samples.length, true);
  samples.forEach((sample, i) => {
    const clipped = Math.max(-1, Math.min(1, sample));
    view.setInt16(44 + 2 * i, clipped < 0 ? clipped * 0x8000 : clipped * 0x7fff, true);
  });
  return new Blob([view], { type: "audio/wav" });
}

// Runs on the audio thread: the microphone at the context's rate (44.1 or 48 kHz, as the
// device gives it) → 16 kHz mono PCM16, posted to the page in 20 ms chunks.
// Each output sample is the mean of the input samples in its 1/16000 s span (a box filter:
// it keeps the speech band and blunts aliasing without a filter design; fractional ratios
// such as 44.1k/16k carry the remainder into the next span).
const OUT_RATE = 16000;
const CHUNK = 320; // 20 ms: 50 messages/s, well inside the gateway's 200/s

class Downsampler extends AudioWorkletProcessor {
  constructor() {
    super();
    this.ratio = sampleRate / OUT_RATE; // `sampleRate` is the worklet scope's global
    this.sum = 0;
    this.count = 0;
    this.pos = 0;
    this.fresh();
  }

  fresh() {
    // A DataView, not an Int16Array: pcm16 on the wire is little-endian whatever the CPU.
    this.out = new DataView(new ArrayBuffer(2 * CHUNK));
    this.len = 0;
  }

  process(inputs) {
    const samples = inputs[0] && inputs[0][0]; // first channel: the session is mono
    if (!samples) return true;
    for (let i = 0; i < samples.length; i++) {
      this.sum += samples[i];
      this.count += 1;
      this.pos += 1;
      if (this.pos < this.ratio) continue;
      this.pos -= this.ratio;
      const v = Math.round((this.sum / this.count) * 32768);
      this.out.setInt16(2 * this.len++, v > 32767 ? 32767 : v < -32768 ? -32768 : v, true);
      this.sum = 0;
      this.count = 0;
      if (this.len === CHUNK) {
        this.port.postMessage(this.out.buffer, [this.out.buffer]); // moved, not copied
        this.fresh();
      }
    }
    return true; // keep running while the page holds the node
  }
}

registerProcessor("downsampler", Downsampler);
